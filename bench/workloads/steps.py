"""Steps per second of a small PyTorch training loop with the image's progress hooks on and
off, for bench/hangs.py. One process: blocks of steps alternate between the hooks on
(torch's global optimizer-step hook and the backward wrapper, as disttrain/progress.py
installs them, its reporting thread running) and off (the same hooks taken out), so the
machine's noise falls on both alike.

    python bench/workloads/steps.py --rounds 20 --block 500 --hidden 256
prints 'STEPS on=<steps per CPU-s> off=<steps per CPU-s> wall_on=... wall_off=...' (medians
over the blocks; CPU time of this process, its reporting thread included).
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("DISTTRAIN_PROGRESS", tempfile.mkdtemp(prefix="disttrain-steps-"))
from disttrain import progress  # noqa: E402

progress.install()                 # what the image's .pth line does in every process

import torch  # noqa: E402
import torch.optim.optimizer as optimizer  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=20)
p.add_argument("--block", type=int, default=500)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--batch", type=int, default=64)
args = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(args.batch, args.hidden), torch.randn(args.batch, 1)

hooked = (dict(optimizer._global_optimizer_pre_hooks), dict(optimizer._global_optimizer_post_hooks),
          torch.autograd.backward)
assert hooked[1] and hasattr(hooked[2], "__wrapped__"), "the progress hooks are not installed"


def hooks(on: bool) -> None:
    for live, saved in zip((optimizer._global_optimizer_pre_hooks, optimizer._global_optimizer_post_hooks), hooked):
        live.clear()
        if on:
            live.update(saved)
    torch.autograd.backward = hooked[2] if on else hooked[2].__wrapped__


def block() -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.block):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return args.block / (time.perf_counter() - wall), args.block / (time.process_time() - cpu)


block()                                            # warm up (and the first step starts the reporting thread)
rates = {True: [], False: []}
for i in range(args.rounds):
    for on in ((True, False) if i % 2 else (False, True)):
        hooks(on)
        rates[on].append(block())
hooks(True)
assert progress.current().steps >= args.rounds * args.block, "the hooks did not count the steps"
med = {on: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for on, r in rates.items()}
print(f"STEPS on={med[True][1]:.1f} off={med[False][1]:.1f} wall_on={med[True][0]:.1f} wall_off={med[False][0]:.1f}",
      flush=True)
