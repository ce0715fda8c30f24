"""Who am I in the job? Read from whatever launched this process. Pure."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    framework: str
    launcher: str
    parallel_mode: str
    tp_size: int
    dp_size: int
    sync_mode: str
    sync_period: int
    data_dir: str
    checkpoint_dir: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_env(env: dict[str, str]) -> "RankInfo":
        def first(*names: str, default: str) -> int:
            for name in names:
                if env.get(name, "") != "":
                    return int(env[name])
            return int(default)

        rank = first("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", default="0")
        world = first("WORLD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS",
                      default="1")
        if "TF_CONFIG" in env and "RANK" not in env:
            tf_config = json.loads(env["TF_CONFIG"])
            cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
            world = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
            offset = len(cluster.get("chief", [])) if task.get("type") == "worker" else 0
            rank = offset + int(task.get("index", 0))
        local_rank = first("LOCAL_RANK", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                           "SLURM_LOCALID", default="0")
        local_world = first("LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                            "MPI_LOCALNRANKS", default="1")
        tp = first("TP_SIZE", default="1")
        return RankInfo(
            rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
            node_rank=first("NODE_RANK", "GROUP_RANK", default=str(rank // max(1, local_world))),
            framework=env.get("FRAMEWORK", "pytorch"), launcher=env.get("LAUNCHER", "native"),
            parallel_mode=env.get("PARALLEL_MODE", "data_parallel"), tp_size=tp,
            dp_size=first("DP_SIZE", default=str(max(1, world // max(1, tp)))),
            sync_mode=env.get("SYNC_MODE", "sync"), sync_period=first("SYNC_PERIOD", default="8"),
            data_dir=env.get("DATA_DIR", "/app/data"), checkpoint_dir=env.get("CHECKPOINT_DIR", "/app/checkpoints"),
        )


def context() -> RankInfo:
    return RankInfo.from_env(dict(os.environ))
