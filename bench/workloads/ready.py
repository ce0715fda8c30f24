"""Rendezvous workload: report when the framework is imported, join the job with the
framework's own API, then report when every rank is in."""
import os
import time

framework = os.environ.get("FRAMEWORK", "pytorch")
launcher = os.environ.get("LAUNCHER", "native")
rank_env = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "?"))
if launcher == "horovod":
    import horovod.torch as hvd
    import torch
    print(f"IMPORTED rank={rank_env} t={time.time():.6f}", flush=True)
    hvd.init()
    hvd.allreduce(torch.ones(1), name="ready")
    rank = hvd.rank()
elif framework == "pytorch":
    import torch
    import torch.distributed as dist
    print(f"IMPORTED rank={rank_env} t={time.time():.6f}", flush=True)
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    rank = dist.get_rank()
else:
    import json
    import tensorflow as tf
    print(f"IMPORTED rank={rank_env} t={time.time():.6f}", flush=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print(f"READY rank={rank} t={time.time():.6f}", flush=True)
# Leave without interpreter teardown (torch and TensorFlow take seconds to tear down):
# what is measured is joining, and every rank has passed the collective above.
if launcher != "horovod" and framework == "pytorch":
    dist.barrier()
os._exit(0)
