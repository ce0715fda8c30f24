"""The bundled example, as /app/code/train.py: picks the example that fits the launch.

    FRAMEWORK=pytorch  LAUNCHER=native   -> pytorch_ddp.py (local SGD if SYNC_MODE=async)
    FRAMEWORK=pytorch  MIN_NODES set     -> pytorch_elastic.py (elastic: MIN_NODES:MAX_NODES), or
                       with LAUNCHER=horovod pytorch_horovod_elastic.py (hvd.elastic)
    FRAMEWORK=pytorch  PARALLEL_MODE=model_parallel|hybrid -> pytorch_hybrid.py
    FRAMEWORK=pytorch  LAUNCHER=horovod  -> pytorch_horovod.py
    FRAMEWORK=pytorch  PJRT_DEVICE set (PyTorch/XLA: TPU, or XLA's CPU client) -> pytorch_xla.py
    FRAMEWORK=tensorflow|keras LAUNCHER=native -> tensorflow_mwms.py (tensorflow_ps.py if async)
    FRAMEWORK=tensorflow|keras LAUNCHER=horovod -> keras_horovod.py, or with MIN_NODES
                       keras_horovod_elastic.py (hvd.elastic)
    FRAMEWORK=mxnet    LAUNCHER=native   -> mxnet_kvstore.py (parameter servers: dist_sync, dist_async)
    FRAMEWORK=mxnet    LAUNCHER=horovod  -> mxnet_horovod.py
"""

import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
framework = os.environ.get("FRAMEWORK", "pytorch")
launcher = os.environ.get("LAUNCHER", "native")
parallel = os.environ.get("PARALLEL_MODE", "data_parallel")
sync = os.environ.get("SYNC_MODE", "sync")

if framework == "pytorch":
    if os.environ.get("PJRT_DEVICE"):
        name = "pytorch_xla.py"
    elif os.environ.get("MIN_NODES"):
        name = "pytorch_horovod_elastic.py" if launcher == "horovod" else "pytorch_elastic.py"
    elif parallel != "data_parallel":
        name = "pytorch_hybrid.py"
    else:
        name = "pytorch_horovod.py" if launcher == "horovod" else "pytorch_ddp.py"
elif framework == "mxnet":
    name = "mxnet_horovod.py" if launcher == "horovod" else "mxnet_kvstore.py"
else:
    if launcher == "horovod":
        name = "keras_horovod_elastic.py" if os.environ.get("MIN_NODES") else "keras_horovod.py"
    else:
        name = "tensorflow_ps.py" if sync == "async" else "tensorflow_mwms.py"

sys.path.insert(0, here)
sys.argv[0] = os.path.join(here, name)
runpy.run_path(sys.argv[0], run_name="__main__")
