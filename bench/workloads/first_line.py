"""Launch-overhead workload: report the wall-clock time of this script's first line."""
import os
import time

print(f"FIRST_LINE rank={os.environ.get('RANK', os.environ.get('HOROVOD_RANK', '0'))} t={time.time():.6f}", flush=True)
