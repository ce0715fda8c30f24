"""A training script written against the frameworks' own APIs (DDP(model), or Horovod's
hvd.DistributedOptimizer), with no disttrain import: whatever GRAD_COMPRESSION,
GRAD_ACCUMULATION and GRAD_BUCKET_MB do, the image does to it.

Prints, from every rank:
  HOOKS rank=R ddp_hooks=NAMES bucket_bytes=N buckets=B  (DDP only) what the running DDP holds
  GRADS rank=R step=S fp16=0|1 bf16=0|1 weight_rank=K  the synchronized gradient, as seen
        by the optimizer: whether every value is exactly an fp16 (bf16) number, and the
        matrix rank of the first layer's gradient (PowerSGD sends a rank-r approximation)
  MICRO rank=R grad=HEX                                the first micro-batch's gradient, when
        there are several: equal on every rank if it was synchronized
  FIRST rank=R max_diff=D                              the first update against one plain
        SGD step on the combined batch of every rank's micro-batches
  DONE rank=R before=L0 after=L1 digest=HEX            loss on a fixed batch, parameters' hash
  FUSION rank=R threshold=BYTES                        (Horovod only) the fusion buffer Horovod reads
"""

import argparse
import hashlib
import os

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--micro", type=int, default=int(os.environ.get("GRAD_ACCUMULATION", "1")),
               help="micro-batches per update (the script's loop does nothing else with it)")
p.add_argument("--wide", type=int, default=0,
               help="a W x W hidden layer in the middle: parameters enough for several DDP buckets")
args = p.parse_args()

horovod = os.environ.get("LAUNCHER") == "horovod"
if horovod:
    import horovod.torch as hvd
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    print(f"FUSION rank={rank} threshold={os.environ.get('HOROVOD_FUSION_THRESHOLD', 'unset')}", flush=True)
else:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
IN, HIDDEN, BATCH = 32, 24, 16
LR = 0.01 if args.wide else 0.05              # the wide net diverges at 0.05
TRUE = torch.randn(IN, 1)


def net():
    torch.manual_seed(1)
    if args.wide:
        return torch.nn.Sequential(torch.nn.Linear(IN, args.wide), torch.nn.Tanh(),
                                   torch.nn.Linear(args.wide, args.wide), torch.nn.Tanh(), torch.nn.Linear(args.wide, 1))
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def batch(step, r, k):
    g = torch.Generator().manual_seed(100_000 * step + 100 * r + k)
    x = torch.randn(BATCH, IN, generator=g)
    return x, x @ TRUE + 0.01 * torch.randn(BATCH, 1, generator=g)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


# The combined-batch reference for the first update: every rank's micro-batches, one step.
reference = net()
xs, ys = zip(*(batch(0, r, k) for r in range(world) for k in range(args.micro)))
loss_of(reference, torch.cat(xs), torch.cat(ys)).backward()
with torch.no_grad():
    for q in reference.parameters():
        q -= LR * q.grad

model = net()
fixed_x, fixed_y = batch(10**6, 0, 0)
before = loss_of(model, fixed_x, fixed_y).item()
if horovod:
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # compression=none passed explicitly, as Horovod's own examples do: no choice of the script's
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters(), compression=hvd.Compression.none)
    trained = model
else:
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    trained = model.module


def exact(g, dtype):
    return int(bool(torch.equal(g, g.to(dtype).float())))


for step in range(args.steps):
    for k in range(args.micro):
        optimizer.zero_grad()
        x, y = batch(step, rank, k)
        loss_of(model, x, y).backward()
        last = k == args.micro - 1
        if step == 0 and k == 0 and not last:
            # Synchronized gradients are the same on every rank; local ones are not.
            local = hashlib.sha256(trained[0].weight.grad.numpy().tobytes()).hexdigest()[:16]
            print(f"MICRO rank={rank} grad={local}", flush=True)
        if last and horovod:
            optimizer.synchronize()
        if last and step in (0, args.steps - 1):
            grad = trained[0].weight.grad
            print(f"GRADS rank={rank} step={step} fp16={exact(grad, torch.float16)} "
                  f"bf16={exact(grad, torch.bfloat16)} weight_rank={int(torch.linalg.matrix_rank(grad))}", flush=True)
        if last and horovod:
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
    if step == 0:
        diff = max((a - b).abs().max().item() for a, b in zip(trained.parameters(), reference.parameters()))
        print(f"FIRST rank={rank} max_diff={diff:.3g}", flush=True)

if not horovod:       # at the end: DDP sizes its buckets again after the first iteration
    hooks = ",".join(h.__name__ for h, _ in model._comm_hooks) or "none"
    logged = model._get_ddp_logging_data()
    buckets = len(logged.get("rebuilt_bucket_sizes", logged.get("bucket_sizes", "")).split(", "))
    print(f"HOOKS rank={rank} ddp_hooks={hooks} bucket_bytes={model.bucket_bytes_cap} buckets={buckets}", flush=True)
after = loss_of(trained, fixed_x, fixed_y).item()
digest = hashlib.sha256(b"".join(q.detach().numpy().tobytes() for q in trained.parameters())).hexdigest()[:16]
print(f"DONE rank={rank} before={before:.4f} after={after:.4f} digest={digest}", flush=True)
if horovod:
    hvd.shutdown()
else:
    dist.barrier()
    dist.destroy_process_group()
