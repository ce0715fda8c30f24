"""A TensorFlow server for one TF_CONFIG task (parameter servers and PS-mode workers).

    python -m disttrain.tf_server

Started by the entrypoint for SYNC_MODE=async; it serves until the entrypoint stops it
when the chief's training script ends.
"""

import json
import os
import signal
import sys
import threading
import time


def main() -> int:
    import tensorflow as tf

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"],
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"serving {task['type']} {task['index']} at {server.target}", flush=True)
    # server.join() blocks inside TensorFlow, where Python signal handlers never run: keep
    # the main thread in Python and leave at once on SIGTERM (the server holds no state
    # worth flushing; the chief owns the model).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threading.Thread(target=server.join, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
