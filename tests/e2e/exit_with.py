"""A training script that fails on one rank with a code of its own: `--rank R --code C`
(the other ranks wait to be stopped)."""

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--code", type=int, default=7)
args, _ = parser.parse_known_args()
rank = int(os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
if rank == args.rank:
    print(f"rank {rank}: exiting with {args.code}", flush=True)
    sys.exit(args.code)
print(f"rank {rank}: waiting", flush=True)
time.sleep(60)
