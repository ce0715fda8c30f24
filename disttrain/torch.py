"""PyTorch helpers: one init for torchrun, Horovod and mpirun, the mesh for PARALLEL_MODE,
sync or local-SGD training, and a shutdown that cannot strand a peer.

    from disttrain import torch as dt
    dt.init()
    model = dt.wrap_model(model.to(dt.device()))
    optimizer = dt.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=...), model)
    ...
    dt.shutdown()
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os

import torch
import torch.distributed as dist

from .env import RankInfo, context

_state: dict = {}


def uses_horovod(info: RankInfo | None = None) -> bool:
    return (info or context()).launcher == "horovod"


def device() -> torch.device:
    info = context()
    if torch.cuda.is_available():
        return torch.device("cuda", info.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init(backend: str | None = None, timeout_s: int = 1800) -> RankInfo:
    """Join the job: horovod.init() under LAUNCHER=horovod, else init_process_group."""
    info = context()
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
    if uses_horovod(info):
        import horovod.torch as hvd
        hvd.init()
        _state["hvd"] = hvd
        return info
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:        # a plain single process
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=_dt.timedelta(seconds=timeout_s))
    return info


def rank() -> int:
    return _state["hvd"].rank() if "hvd" in _state else (dist.get_rank() if dist.is_initialized() else 0)


def world_size() -> int:
    return _state["hvd"].size() if "hvd" in _state else (dist.get_world_size() if dist.is_initialized() else 1)


def mesh():
    """A (dp, tp) DeviceMesh from PARALLEL_MODE/TP_SIZE: 'dp' replicates, 'tp' splits the model."""
    from torch.distributed.device_mesh import init_device_mesh

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


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: equal on every replica after synchronous training."""
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def shutdown() -> None:
    """Barrier, then tear down. A rank that leaves without the barrier can crash at exit
    ('terminate called without an active exception') and strand its peers."""
    if "hvd" in _state:
        barrier()
        _state.pop("hvd").shutdown()
    elif dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
