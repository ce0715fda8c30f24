"""Horovod allreduce of [rank + 1] * 4 with the framework in argv[1]; prints the result."""
import sys

framework = sys.argv[1]
if framework == "pytorch":
    import horovod.torch as hvd
    import torch
    hvd.init()
    result = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1)), op=hvd.Sum).tolist()
elif framework == "mxnet":
    import horovod.mxnet as hvd
    import mxnet as mx
    hvd.init()
    result = hvd.allreduce(mx.nd.full((4,), float(hvd.rank() + 1)), average=False).asnumpy().tolist()
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    result = hvd.allreduce(tf.fill([4], float(hvd.rank() + 1)), op=hvd.Sum).numpy().tolist()
print(f"RESULT {framework} rank={hvd.rank()} size={hvd.size()} sum={result}", flush=True)
hvd.shutdown()
