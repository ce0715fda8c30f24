"""A training loop of fixed work (NumPy matmuls) that checkpoints `--mib` MiB every `--every`
steps with disttrain.checkpoint; prints the loop's time, each save's time and wall clock
(SAVED step=N t=...), and the step a resume found (RESUMED step=N t=...)."""
import argparse
import os
import time

import numpy as np

from disttrain import checkpoint

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--every", type=int, default=10)
p.add_argument("--mib", type=int, default=64)
p.add_argument("--work", type=int, default=384)
args = p.parse_args()

found = checkpoint.latest()
print(f"RESUMED step={found[0] if found else 0} t={time.time():.6f}", flush=True)
a = np.random.default_rng(0).standard_normal((args.work, args.work))
blob = os.urandom(args.mib * 2**20)
saves = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    for _ in range(4):
        a = np.tanh(a @ a.T / args.work)
    if args.every and step % args.every == 0:
        t0 = time.perf_counter()
        checkpoint.save(blob, step, writer=lambda obj, f: f.write(obj), ext="bin", keep=2)
        saves.append(time.perf_counter() - t0)
        print(f"SAVED step={step} t={time.time():.6f}", flush=True)
print(f"LOOP seconds={time.perf_counter() - start:.4f} saves={sum(saves):.4f} n={len(saves)}", flush=True)
