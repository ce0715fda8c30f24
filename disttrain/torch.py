"""PyTorch helpers: one init for torchrun, Horovod, mpirun and PyTorch/XLA, the mesh for
PARALLEL_MODE, sync or local-SGD training, and a shutdown that cannot strand a peer.

    from disttrain import torch as dt

    def main():
        dt.init()                  # gloo / NCCL / Horovod, or the xla:// group under PJRT_DEVICE
        model = dt.wrap_model(model.to(dt.device()))
        optimizer = dt.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=...), model)
        ...
        dt.finish()                # barrier, tear down, exit (dt.shutdown() to go on after)

    if __name__ == "__main__":
        dt.launch(main)            # PyTorch/XLA on a host: one process per TPU chip; else main()

Under PyTorch/XLA (PJRT_DEVICE set: the tpu variant on a TPU host, or XLA's CPU client)
device() is the XLA device, init() joins the 'xla' process group through xla://, and
wrap_model wraps in DDP over it. Step with `torch_xla.sync()` (or `sync()` here) after
optimizer.step(): XLA runs the traced step then.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import logging
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist

from . import gradsync, preemption
from .env import RankInfo, context

_state: dict = {}


def uses_horovod(info: RankInfo | None = None) -> bool:
    return (info or context()).launcher == "horovod"


def uses_xla() -> bool:
    """PyTorch/XLA runs this process: PJRT_DEVICE names its device (TPU, CPU)."""
    return bool(os.environ.get("PJRT_DEVICE"))


def device() -> torch.device:
    if uses_xla():
        import torch_xla
        return torch_xla.device()
    info = context()
    if torch.cuda.is_available():
        return torch.device("cuda", info.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init(backend: str | None = None, timeout_s: int = 1800) -> RankInfo:
    """Join the job: horovod.init() under LAUNCHER=horovod, the 'xla' group under PyTorch/XLA,
    else init_process_group (gloo, or NCCL on GPUs)."""
    info = context()
    gradsync.install()        # the image's .pth did it already; outside an image, here
    if uses_xla():
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the 'xla' backend)
        import torch_xla.runtime as xr
        if not dist.is_initialized():
            dist.init_process_group("xla", init_method="xla://", timeout=_dt.timedelta(seconds=timeout_s))
        # Ranks are PJRT's (a rank per XLA device), not the launcher's.
        return dataclasses.replace(info, rank=dist.get_rank(), world_size=dist.get_world_size(),
                                   local_rank=xr.local_ordinal(), local_world_size=xr.local_device_count())
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
    if uses_horovod(info):
        import horovod.torch as hvd
        hvd.init()
        _state["hvd"] = hvd
        return info
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            os.environ.update(_one_host_rendezvous(info, os.environ))
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=_dt.timedelta(seconds=timeout_s))
    return info


def _one_host_rendezvous(info: RankInfo, env) -> dict[str, str]:
    """torch.distributed's variables for a process that no torchrun started: a plain single
    process, or one of the ranks that mpirun, horovodrun or srun started on one host (their
    rank and size, as context() reads them, meeting on 127.0.0.1:MASTER_PORT, 29500 unless
    set). Across hosts, only the user knows where rank 0 is: MASTER_ADDR must be set."""
    single_host = info.local_world_size >= info.world_size or "1" in (env.get("SLURM_NNODES"),
                                                                      env.get("SLURM_JOB_NUM_NODES"))
    if not single_host:
        raise RuntimeError(f"disttrain.torch.init(): rank {info.rank} of {info.world_size} on more than one host "
                           f"({info.local_world_size} here) and no MASTER_ADDR: set MASTER_ADDR (rank 0's host) "
                           f"and MASTER_PORT for every rank, or start the job with the image's entrypoint")
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": env.get("MASTER_PORT", "29500"),
            "RANK": str(info.rank), "WORLD_SIZE": str(info.world_size)}


class _Launched:
    """Picklable fn(*args) for torch_xla.launch, which passes the device index first."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __call__(self, _index):
        self.fn(*self.args)


def launch(fn, *args) -> None:
    """Run fn(*args) as this host's training processes. Under PyTorch/XLA started one process
    per host (the entrypoint's default on TPU; not under torchrun) that is torch_xla.launch:
    one process per TPU chip (XLA's CPU client: one process, CPU_NUM_DEVICES devices). Else
    fn runs here, once: the launcher already started a process per device."""
    if uses_xla() and not dist.is_torchelastic_launched():
        if os.environ["PJRT_DEVICE"].upper() == "CPU" and int(os.environ.get("CPU_NUM_DEVICES", "1")) > 1:
            # torch_xla runs CPU devices as threads of one process, and their concurrent compiles
            # give the same collective different op ids: XLA aborts the step after 10 s.
            raise RuntimeError("dt.launch: one XLA CPU device per process (CPU_NUM_DEVICES="
                               f"{os.environ['CPU_NUM_DEVICES']}); for several, shard one program over "
                               "them with torch_xla.distributed.spmd")
        import torch_xla
        torch_xla.launch(_Launched(fn, args))
    else:
        fn(*args)


def sync() -> None:
    """Run the traced step on the XLA device (torch_xla.sync); nothing elsewhere."""
    if uses_xla():
        import torch_xla
        torch_xla.sync()


def rank() -> int:
    return _state["hvd"].rank() if "hvd" in _state else (dist.get_rank() if dist.is_initialized() else 0)


def world_size() -> int:
    return _state["hvd"].size() if "hvd" in _state else (dist.get_world_size() if dist.is_initialized() else 1)


def mesh():
    """A (dp, tp) DeviceMesh from PARALLEL_MODE/TP_SIZE: 'dp' replicates, 'tp' splits the model."""
    from torch.distributed.device_mesh import init_device_mesh

    if uses_xla():
        raise RuntimeError("dt.mesh(): the (dp, tp) DeviceMesh is for CPU and CUDA devices; on XLA use "
                           "torch_xla.distributed.spmd.Mesh")
    info = context()
    dp, tp = info.dp_size or world_size() // max(1, info.tp_size), info.tp_size
    if dp * tp != world_size():
        raise RuntimeError(f"DP_SIZE={dp} x TP_SIZE={tp} != world size {world_size()}")
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    return init_device_mesh(kind, (dp, tp), mesh_dim_names=("dp", "tp"))


def wrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """DDP (native), or broadcast the initial parameters (Horovod). SYNC_MODE=async adds
    torch's post-local-SGD hook: gradients are averaged every step until the warm-up ends,
    then each replica steps alone and PeriodicModelAverager averages every SYNC_PERIOD."""
    info = context()
    if "hvd" in _state:
        _state["hvd"].broadcast_parameters(model.state_dict(), root_rank=0)
        return model
    if world_size() == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    if uses_xla():
        return DDP(model, gradient_as_bucket_view=True)     # as torch_xla's PJRT guide wraps it
    ids = [device().index] if device().type == "cuda" else None
    ddp = DDP(model, device_ids=ids)
    if info.sync_mode == "async":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local_sgd
        # After the warm-up, gradients are averaged only inside a node (the subgroup) and the
        # model across nodes every SYNC_PERIOD steps. torch derives the subgroup from the
        # CUDA device count; on CPU it is given: this node's processes.
        subgroup = None if torch.cuda.is_available() else dist.new_subgroups(group_size=info.local_world_size)[0]
        state = local_sgd.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                            start_localSGD_iter=info.sync_period)
        ddp.register_comm_hook(state, local_sgd.post_localSGD_hook)
    return ddp


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
    info = context()
    if "hvd" in _state:
        hvd = _state["hvd"]
        wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(wrapped, root_rank=0)
        return wrapped
    if info.sync_mode == "async" and world_size() > 1:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer
        averager = PeriodicModelAverager(period=info.sync_period, warmup_steps=info.sync_period)
        return PostLocalSGDOptimizer(optim=optimizer, averager=averager)
    return optimizer


def average_parameters(model: torch.nn.Module) -> None:
    """Make every replica's parameters the mean over replicas (end of local SGD)."""
    if world_size() == 1:
        return
    for p in model.parameters():
        if "hvd" in _state:
            p.data.copy_(_state["hvd"].allreduce(p.data, op=_state["hvd"].Average))
        else:
            dist.all_reduce(p.data, op=dist.ReduceOp.SUM)
            p.data.div_(world_size())


def barrier() -> None:
    if "hvd" in _state:
        _state["hvd"].allreduce(torch.zeros(1), name="disttrain.barrier")
    elif dist.is_initialized():
        dist.barrier()


def stop_requested() -> bool:
    """Whether any rank was asked to stop (SIGTERM, once disttrain.preemption.catch() ran):
    the same answer on every rank at the same call, so that they all checkpoint the same
    step and leave together. One all-reduce (max) of one number; with one process, this
    process's own flag."""
    flag = torch.tensor([1.0 if preemption.requested() else 0.0])
    if "hvd" in _state:
        hvd = _state["hvd"]
        return bool(hvd.allreduce(flag, op=hvd.Max, name="disttrain.stop_requested").item())
    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = flag.to(device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def to_cpu(obj):
    """A copy of a (nested) state with every tensor on the CPU: XLA tensors for torch.save."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: equal on every replica after synchronous training."""
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def shutdown() -> None:
    """Barrier, then tear down. A rank that leaves without the barrier can crash at exit
    ('terminate called without an active exception') and strand its peers. To end the
    script there, finish() is safer."""
    if "hvd" in _state:
        barrier()
        _state.pop("hvd").shutdown()
    elif dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def finish(code: int = 0) -> NoReturn:
    """shutdown(), then end the process now with `code`: stdout, stderr and logging flushed,
    the interpreter's own teardown skipped. There, after the script's last line and a clean
    destroy_process_group, torch 2.13 with Gloo sometimes aborts a rank that has finished
    ('terminate called without an active exception' from one of its C++ threads: 2 of
    the last 2 CI runs had one such rank), and its launcher then fails the job. atexit
    handlers and finalizers do not run: call it last."""
    shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
