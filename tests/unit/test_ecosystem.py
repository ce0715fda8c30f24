"""Kubeflow, Slurm, mpirun and TFJob variables map onto the contract; conflicts are errors."""

import json

import pytest

from entrypoint.contract.config import ConfigError, load_config
from entrypoint.contract.schedulers import first_host, translate
from entrypoint.contract.manifest import Image

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


# --------------------------------------------------------------------------- batch platforms
# Each case: the variables the platform sets on one node, and the contract they give.
PLATFORMS = [
    ("aws-batch", {"AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "1",
                   "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.3.7", "AWS_BATCH_JOB_ID": "ab12-cd#0"},
     (3, 2, "worker", "10.0.3.7")),
    ("aws-batch", {"AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "1",
                   "HOSTNAME": "ip-10-0-3-7"},
     (3, 0, "master", "ip-10-0-3-7")),
    ("leaderworkerset", {"LWS_LEADER_ADDRESS": "train-0.train.default", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "3"},
     (4, 3, "worker", "train-0.train.default")),
    ("volcano", {"VC_MASTER_HOSTS": "job-master-0.job", "VC_MASTER_NUM": "1",
                 "VC_WORKER_HOSTS": "job-worker-0.job,job-worker-1.job", "VC_WORKER_NUM": "2", "VC_TASK_INDEX": "1",
                 "HOSTNAME": "job-worker-1"},
     (3, 2, "worker", "job-master-0.job")),
    ("volcano", {"VC_TRAINER_HOSTS": "t-0.j,t-1.j", "VC_TRAINER_NUM": "2", "VC_TASK_INDEX": "0", "HOSTNAME": "pod-x"},
     (2, 0, "master", "t-0.j")),
    ("sagemaker", {"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-2"}, (2, 1, "worker", "algo-1")),
    ("vertex-ai", {"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["cmle-0:2222"],
                                                           "workerpool1": ["cmle-w0:2222", "cmle-w1:2222"]},
                                               "task": {"type": "workerpool1", "index": 1}})},
     (3, 2, "worker", "cmle-0")),
    ("jobset", {"JOBSET_NAME": "llm", "REPLICATED_JOB_NAME": "trainer", "JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "0",
                "NUM_NODES": "2"},
     (2, 0, "master", "llm-trainer-0-0.llm")),
    ("jobset", {"JOB_COMPLETION_INDEX": "1", "NUM_NODES": "2", "MASTER_ADDR": "train-0.train"},
     (2, 1, "worker", "train-0.train")),
]


@pytest.mark.parametrize("platform, env, expected", PLATFORMS, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(PLATFORMS)])
def test_batch_platforms_variables_make_the_node(platform, env, expected):
    t, c = contract(env)
    assert t.scheduler == platform
    assert (c.num_nodes, c.node_rank, c.role, c.master_addr) == expected
    assert c.train_mode == "distributed"


def test_aws_batch_job_id_becomes_the_run_id():
    t, c = contract(PLATFORMS[0][1])
    assert c.run_id == "ab12-cd" and c.sources["RUN_ID"] == "AWS_BATCH_JOB_ID"


def test_vertex_reduction_servers_are_not_nodes():
    spec = {"cluster": {"workerpool0": ["m:2222"], "workerpool2": ["r:2222"]}, "task": {"type": "workerpool2", "index": 0}}
    t = translate({"CLUSTER_SPEC": json.dumps(spec)})
    assert t.scheduler == "vertex-ai" and "NUM_NODES" not in t.env


def test_an_indexed_job_of_independent_runs_is_left_alone():
    t = translate({"JOB_COMPLETION_INDEX": "4"})
    assert t.scheduler is None and "NODE_RANK" not in t.env


@pytest.mark.parametrize("env, names", [
    ({"SM_HOSTS": "algo-1", "SM_CURRENT_HOST": "algo-1"}, "SM_HOSTS"),
    ({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-9"}, "SM_CURRENT_HOST"),
    ({"CLUSTER_SPEC": "{"}, "CLUSTER_SPEC"),
    ({"AWS_BATCH_JOB_NUM_NODES": "two"}, "AWS_BATCH_JOB_NUM_NODES"),
    ({"VC_A_HOSTS": "a-0", "VC_B_HOSTS": "b-0", "VC_TASK_INDEX": "0"}, "master"),
    ({"LWS_LEADER_ADDRESS": "l", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1", "NODE_RANK": "0"}, "LWS_WORKER_INDEX"),
])
def test_bad_or_contradicted_platform_variables_are_one_line(env, names):
    with pytest.raises(ConfigError) as caught:
        contract(env)
    assert names in str(caught.value) and "\n" not in str(caught.value)
