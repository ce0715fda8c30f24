"""MXNet helpers: the kvstore (or Horovod trainer) that matches the launch, in one call.

    from disttrain import mxnet as dmx
    kv = dmx.kvstore()                   # dist_sync / dist_async (LAUNCHER=native), else local
    trainer = dmx.trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    dmx.rank(), dmx.world_size()

Under LAUNCHER=native the entrypoint started MXNet's parameter-server job: a scheduler and
NUM_PS servers on the master, the workers on every node, each with its DMLC_* role. The
kvstore type follows SYNC_MODE: `dist_sync` (the servers apply one update per step, from
every worker's gradients) or `dist_async` (each worker's gradients are applied as they
arrive). Under LAUNCHER=horovod, MXNet 1.9 has no Horovod kvstore: `trainer()` returns
horovod.mxnet's DistributedTrainer, after broadcasting rank 0's parameters.
"""

from __future__ import annotations

import os
import sys

from .env import RankInfo, context

_state: dict = {}


def kvstore_type(info: RankInfo | None = None, env: dict[str, str] | None = None) -> str:
    """'dist_sync' | 'dist_async' when the entrypoint started a parameter-server job, else 'local'. Pure."""
    info = info or context()
    env = os.environ if env is None else env
    if info.launcher == "horovod":
        raise RuntimeError("LAUNCHER=horovod: MXNet 1.9 has no Horovod kvstore; use disttrain.mxnet.trainer() "
                           "or horovod.mxnet.DistributedTrainer")
    if env.get("DMLC_ROLE") != "worker":
        return "local"
    return "dist_async" if info.sync_mode == "async" else "dist_sync"


def kvstore():
    """The kvstore for this launch, created once (it joins the parameter-server job)."""
    if "kv" not in _state:
        import mxnet as mx

        _state["kv"] = kv = mx.kv.create(kvstore_type())
        expected = os.environ.get("RANK")
        if kv.type.startswith("dist") and expected is not None and int(expected) != kv.rank:
            # The entrypoint predicts MXNet's rank order (addresses, then ports); a worker
            # that lost its port to another program binds a random one and may move.
            print(f"disttrain: WARNING: MXNet gave this worker rank {kv.rank}, RANK={expected} was expected",
                  file=sys.stderr, flush=True)
    return _state["kv"]


def _horovod():
    if "hvd" not in _state:
        import horovod.mxnet as hvd

        hvd.init()
        _state["hvd"] = hvd
    return _state["hvd"]


def rank() -> int:
    if context().launcher == "horovod":
        return _horovod().rank()
    return kvstore().rank


def world_size() -> int:
    if context().launcher == "horovod":
        return _horovod().size()
    return kvstore().num_workers


def trainer(params, optimizer: str, optimizer_params: dict | None = None):
    """A Gluon trainer that averages across the job: gluon.Trainer on the kvstore
    (update_on_kvstore: the servers run the optimizer), or Horovod's DistributedTrainer."""
    from mxnet import gluon

    if context().launcher == "horovod":
        hvd = _horovod()
        hvd.broadcast_parameters(params, root_rank=0)
        return hvd.DistributedTrainer(params, optimizer, optimizer_params or {})
    kv = kvstore()
    return gluon.Trainer(params, optimizer, optimizer_params or {}, kvstore=kv,
                         update_on_kvstore=True if kv.type.startswith("dist") else None)
