"""Kubeflow, Slurm, mpirun and TFJob variables map onto the contract; conflicts are errors."""

import json

import pytest

from entrypoint.config import ConfigError, load_config
from entrypoint.ecosystem import first_host, translate
from entrypoint.manifest import Image

FW, LA = ["pytorch", "tensorflow", "keras"], ["native", "horovod", "mpi"]


def contract(env):
    t = translate(env)
    return t, load_config(t.env, Image(FW, LA), (), t.sources)


def test_kubeflow_pet_variables():
    t, c = contract({"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "2",
                     "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456"})
    assert t.scheduler == "kubeflow"
    assert (c.num_nodes, c.nproc_per_node, c.node_rank, c.role) == (3, 2, 2, "worker")
    assert (c.master_addr, c.master_port, c.train_mode) == ("job-master-0", 23456, "distributed")
    assert c.sources["NUM_NODES"] == "PET_NNODES"


def test_kubeflow_elastic_range():
    _, c = contract({"PET_NNODES": "1:4", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"})
    assert (c.min_nodes, c.max_nodes, c.elastic) == (1, 4, True)


def test_kubeflow_rdzv_endpoint():
    _, c = contract({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_RDZV_ENDPOINT": "etcd-or-master:29400"})
    assert (c.master_addr, c.master_port) == ("etcd-or-master", 29400)


def test_plain_pytorchjob_world_size_and_rank_count_pods():
    _, c = contract({"WORLD_SIZE": "4", "RANK": "3", "MASTER_ADDR": "pytorchjob-master-0", "MASTER_PORT": "23456"})
    assert (c.num_nodes, c.node_rank, c.role) == (4, 3, "worker")


def test_world_size_conflict_with_pet():
    with pytest.raises(ConfigError, match="WORLD_SIZE='5' conflicts with PET_NNODES='2'"):
        translate({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "WORLD_SIZE": "5", "RANK": "0",
                   "MASTER_ADDR": "m"})


def test_explicit_variable_conflicting_with_scheduler_is_an_error():
    with pytest.raises(ConfigError, match="NUM_NODES='3' conflicts with PET_NNODES='2'"):
        translate({"PET_NNODES": "2", "NUM_NODES": "3"})


def test_explicit_variable_agreeing_with_scheduler_is_fine():
    t = translate({"PET_NNODES": "2", "NUM_NODES": "2", "PET_MASTER_ADDR": "m", "MASTER_ADDR": "m"})
    assert t.env["NUM_NODES"] == "2"


def test_slurm_one_task_per_node_is_a_node():
    t, c = contract({"SLURM_PROCID": "1", "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_NODEID": "1",
                     "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "991"})
    assert t.direct is None and t.scheduler == "slurm"
    assert (c.num_nodes, c.node_rank, c.role, c.master_addr, c.run_id) == (2, 1, "worker", "gpu07", "slurm-991")


def test_slurm_task_per_gpu_runs_directly():
    t = translate({"SLURM_PROCID": "5", "SLURM_NNODES": "2", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                   "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "n[1-2]"})
    d = t.direct
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size) == (5, 8, 1, 4)
    assert t.env["MASTER_ADDR"] == "n1"


def test_mpirun_ranks_run_directly():
    t = translate({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                   "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert t.scheduler == "mpirun" and (t.direct.rank, t.direct.world_size, t.direct.local_world_size) == (1, 4, 2)


def test_mpich_pmi_ranks():
    t = translate({"PMI_RANK": "2", "PMI_SIZE": "3"})
    assert (t.direct.rank, t.direct.world_size) == (2, 3)


def test_tf_config_passes_through_untouched():
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})
    t = translate({"TF_CONFIG": tf_config, "FRAMEWORK": "tensorflow"})
    assert t.scheduler == "tfjob" and t.env["TF_CONFIG"] == tf_config


def test_tf_config_with_local_mode_is_a_conflict():
    with pytest.raises(ConfigError, match="TRAIN_MODE='local' conflicts with TF_CONFIG"):
        translate({"TF_CONFIG": "{}x", "TRAIN_MODE": "local"})


def test_bad_scheduler_integer():
    with pytest.raises(ConfigError, match="SLURM_NNODES='two'"):
        translate({"SLURM_PROCID": "0", "SLURM_NNODES": "two"})


@pytest.mark.parametrize("nodelist, first", [
    ("node01", "node01"), ("a1,a2", "a1"), ("gpu[07-09,12],cpu1", "gpu07"), ("rack[1-2]-ib", "rack1-ib"),
    ("n[001-004]", "n001"),
])
def test_first_host_of_slurm_nodelist(nodelist, first):
    assert first_host(nodelist) == first
