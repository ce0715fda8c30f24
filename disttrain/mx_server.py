"""An MXNet parameter-server process: the scheduler or a server (DMLC_ROLE).

    python -m disttrain.mx_server

Started by the entrypoint for LAUNCHER=native. Importing mxnet with DMLC_ROLE=scheduler
or server runs that role's loop, which ends when every worker has finalized its kvstore;
the entrypoint stops it earlier if the job fails (SIGTERM ends it at once).
"""

import os
import sys


def main() -> int:
    role = os.environ["DMLC_ROLE"]
    where = f"{os.environ['DMLC_PS_ROOT_URI']}:{os.environ['DMLC_PS_ROOT_PORT']}" if role == "scheduler" \
        else f"{os.environ.get('DMLC_NODE_HOST', '?')}:{os.environ.get('PORT', '?')}"
    print(f"serving {role} at {where}", flush=True)
    import mxnet  # noqa: F401  (runs the role's loop, then exits the process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
