"""A script for the object-storage tests: prints the checkpoint it resumed from, then writes
checkpoints with disttrain.checkpoint (rank 0), one per `--every` seconds, each `--mib` MiB
of random bytes (step 1 is small), and says WROTE <step> after each; then waits to be
stopped (or ends after `--steps`)."""

import argparse
import hashlib
import os
import time

from disttrain import checkpoint

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2)
p.add_argument("--mib", type=int, default=64)
p.add_argument("--every", type=float, default=3.0)
p.add_argument("--wait", action="store_true", help="after the last step, wait to be stopped")
args = p.parse_args()

found = checkpoint.latest()
if found:
    step, path = found
    print(f"RESUMED step={step} sha256={hashlib.sha256(path.read_bytes()).hexdigest()}", flush=True)
else:
    print("RESUMED step=0", flush=True)
start = found[0] if found else 0
for step in range(start + 1, start + args.steps + 1):
    size = 1024 if step == 1 else args.mib * 2**20
    path = checkpoint.save(os.urandom(size), step, writer=lambda obj, f: f.write(obj), ext="bin")
    if path:
        print(f"WROTE {step} sha256={hashlib.sha256(path.read_bytes()).hexdigest()}", flush=True)
    time.sleep(args.every)
while args.wait:
    time.sleep(1)
