"""Variables that look like the contract's but are not (entrypoint/contract/spelling.py)."""

import pytest

from entrypoint.contract.config import VARIABLE_NAMES, ConfigError
from entrypoint.contract.spelling import suspects
from testing.plans import plan

# The misspellings a new user made, each of which trained with the defaults and exit 0.
MISSPELT = {"FRAMWORK": "FRAMEWORK", "NUM_NODE": "NUM_NODES", "NPROCS_PER_NODE": "NPROC_PER_NODE",
            "LAUNCHR": "LAUNCHER", "CHECKPOINTS_DIR": "CHECKPOINT_DIR", "framework": "FRAMEWORK",
            "MASTER_HOST": "MASTER_ADDR", "NNODES": "NUM_NODES", "PARALELL_MODE": "PARALLEL_MODE"}
# Ordinary variables: the shell's, the schedulers', other libraries', the script's own.
ORDINARY = ["PATH", "HOSTNAME", "HOME", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME",
            "OMP_NUM_THREAD", "HF_HOME", "HF_DATASETS_CACHE", "KUBERNETES_SERVICE_HOST", "KUBERNETES_PORT",
            "SLURM_NNODES", "AWS_REGION", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_NAME", "POD_IP", "LR",
            "BATCH_SIZE", "EPOCHS", "NUM_EPOCHS", "MODEL_NAME", "WANDB_API_KEY", "TORCH_HOME", "PYTHONPATH",
            "LD_LIBRARY_PATH", "TF_FORCE_GPU_ALLOW_GROWTH", "HOROVOD_FUSION_THRESHOLD", "NVIDIA_VISIBLE_DEVICES",
            "DISTTRAIN_JOB_STORE", "TZ", "LANG", "SEED", "OUTPUT_DIR", "LOG_DIR", "DATA_PATH", "TRAIN_ARGS",
            "TRAIN_FILE", "CHECKPOINT_EVERY", "S3_BUCKET", "SYNC_BN",
            # a Kubernetes Service named `master` (and Docker links) in the same namespace
            "MASTER_SERVICE_HOST", "MASTER_SERVICE_PORT", "MASTER_SERVICE_PORT_RDZV", "MASTER_PORT_29500_TCP",
            "MASTER_PORT_29500_TCP_ADDR", "MASTER_PORT_29500_TCP_PORT", "MASTER_PORT_29500_TCP_PROTO"]


@pytest.mark.parametrize("name,likely", sorted(MISSPELT.items()))
def test_a_near_miss_is_named_with_the_likely_variable(name, likely):
    assert suspects({name: "x"}, VARIABLE_NAMES) == [(name, likely)]


def test_ordinary_variables_never_warn_nor_do_the_contracts_own():
    env = {name: "1" for name in ORDINARY + list(VARIABLE_NAMES)}
    assert suspects(env, VARIABLE_NAMES) == []


def test_an_unknown_name_under_a_prefix_only_the_contract_uses_warns_without_a_guess():
    assert suspects({"ELASTIC_WAIT": "5", "STRAGGLER_LIMIT": "2"}, VARIABLE_NAMES) == [
        ("ELASTIC_WAIT", None), ("STRAGGLER_LIMIT", None)]


def test_the_plan_warns_once_per_misspelling_and_trains_with_what_was_given():
    p = plan(FRAMWORK="tensorflow", NUM_NODE=2, LR="0.1")
    assert p.config.framework == "pytorch"
    assert [w for w in p.warnings if "not a variable" in w] == [
        "FRAMWORK is not a variable of this image; did you mean FRAMEWORK? "
        "(UNKNOWN_VARIABLES=error refuses it, =ignore silences this)",
        "NUM_NODE is not a variable of this image; did you mean NUM_NODES? "
        "(UNKNOWN_VARIABLES=error refuses it, =ignore silences this)"]
    assert not [w for w in plan(FRAMWORK="x", UNKNOWN_VARIABLES="ignore").warnings if "not a variable" in w]


def test_strict_mode_refuses_a_misspelling_in_one_line():
    with pytest.raises(ConfigError) as err:
        plan(CHECKPOINTS_DIR="/tmp/x", LAUNCHR="horovod", UNKNOWN_VARIABLES="error")
    assert str(err.value) == ("CHECKPOINTS_DIR is not a variable of this image; did you mean CHECKPOINT_DIR? "
                              "(1 more: LAUNCHR); UNKNOWN_VARIABLES=error refuses it")
    plan(LR="0.1", UNKNOWN_VARIABLES="error")


def test_disttrain_variables_lists_every_variable_with_its_default():
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run([sys.executable, "-m", "entrypoint.commands", "variables"], capture_output=True, text=True,
                          cwd=str(ROOT), timeout=60)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line and not line.startswith((" ", "The", "Bad"))]
    assert listed == list(VARIABLE_NAMES), listed
    assert "UNKNOWN_VARIABLES  (default warn; warn, error, ignore)" in done.stdout


@pytest.mark.parametrize("env", [
    dict(FRAMEWORK="pytorch", LAUNCHER="mpi", NPROC_PER_NODE=2),
    dict(FRAMEWORK="pytorch", NPROC_PER_NODE=2, PARALLEL_MODE="model_parallel"),
    dict(FRAMEWORK="pytorch", LAUNCHER="horovod", NPROC_PER_NODE=2),
    dict(FRAMEWORK="tensorflow", NPROC_PER_NODE=2),
], ids=["mpi", "model_parallel", "horovod", "tensorflow"])
def test_what_the_entrypoint_gives_its_processes_is_never_suspect(env):
    """Under mpirun each rank runs the entrypoint again, with the variables the first one set
    (DP_SIZE, ...): none of them may warn there."""
    from entrypoint.plan import plan_processes
    from testing.plans import at, nodes
    node = plan(TRAIN_MODE="local", **env)
    for spec in plan_processes(node, at(0, nodes(2))):
        assert suspects(spec.env, VARIABLE_NAMES) == [], spec.label
