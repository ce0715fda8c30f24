"""A TensorFlow server for one TF_CONFIG task (parameter servers and PS-mode workers).

    python -m disttrain.tf_server

Started by the entrypoint for SYNC_MODE=async; it serves until the entrypoint stops it
when the chief's training script ends.
"""

import json
import os
import signal
import sys


def main() -> int:
    import tensorflow as tf

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"],
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"serving {task['type']} {task['index']} at {server.target}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
