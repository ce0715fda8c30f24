"""`python -m entrypoint.main` with bad input: one line naming the variable, exit 2, and
nothing started (no child process, no port, no file)."""

import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

BAD = [
    {"FRAMEWORK": "mxnet"},
    {"FRAMEWORK": "jax"},
    {"TRAIN_MODE": "cluster"},
    {"ROLE": "boss", "NUM_NODES": "2", "MASTER_ADDR": "m"},
    {"NUM_NODES": "two"},
    {"NODE_RANK": "9", "NUM_NODES": "2", "MASTER_ADDR": "m"},
    {"TRAIN_MODE": "distributed", "NUM_NODES": "2", "ROLE": "worker"},
    {"MASTER_PORT": "0"},
    {"NPROC_PER_NODE": "lots"},
    {"PARALLEL_MODE": "pipeline"},
    {"PARALLEL_MODE": "hybrid", "TP_SIZE": "3", "NPROC_PER_NODE": "4"},
    {"LAUNCHER": "ssh"},
    {"SYNC_MODE": "later"},
    {"ENTRYPOINT": "/nonexistent/train.py"},
    {"MIN_NODES": "2", "MAX_NODES": "1", "ROLE": "master", "MASTER_ADDR": "m"},
    {"MAX_RESTARTS": "x"},
    {"RDZV_TIMEOUT": "-5"},
    {"COMM_DEBUG": "verbose"},
    {"PET_NNODES": "2", "NUM_NODES": "3"},
    {"JOB_SECRET": "too-short"},
    {"JOB_SECRET_FILE": "/nonexistent/job_secret"},
    {"JOB_SECRET_FILE": "/dev/null"},
    {"NUM_NODE": "2", "UNKNOWN_VARIABLES": "error"},
    {"NET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "eth0"},
    {"GRAD_COMPRESSION": "powersgd", "LAUNCHER": "horovod"},
    {"GRAD_COMPRESSION": "fp16", "FRAMEWORK": "tensorflow"},
    {"GRAD_ACCUMULATION": "0"},
]


def entrypoint(env, *args, timeout=60):
    full = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "ENTRYPOINT": str(ROOT / "examples/train.py"),
            "CHECKPOINT_DIR": "/nonexistent/should-not-be-created", **env}
    return subprocess.run([sys.executable, "-m", "entrypoint.main", *args], env=full, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("env", BAD, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_bad_input_is_one_line_exit_2_nothing_started(env):
    started = time.monotonic()
    result = entrypoint(env)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    named = [k for k in env if k in lines[0]]
    assert named, f"{lines[0]!r} names none of {list(env)}"
    assert result.stdout == ""                 # nothing was launched
    assert time.monotonic() - started < 20
    assert not os.path.exists("/nonexistent/should-not-be-created")


def test_a_checkpoint_dir_that_cannot_be_written_is_one_line_before_anything_starts():
    result = entrypoint({"CHECKPOINT_DIR": "/proc/no-checkpoints-here"})
    assert result.returncode == 2 and result.stdout == "", result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("entrypoint: CHECKPOINT_DIR='/proc/no-checkpoints-here': not writable by uid "), line


def test_explain_says_which_gradient_strategy_applies_by_which_mechanism():
    result = entrypoint({"EXPLAIN": "1", "GRAD_COMPRESSION": "powersgd", "GRAD_ACCUMULATION": "2",
                         "GRAD_BUCKET_MB": "50", "LAUNCHER": "native"})
    assert result.returncode == 0, result.stderr
    said = [line.split("gradients:", 1)[1].strip() for line in result.stdout.splitlines() if "gradients:" in line]
    assert said == ["gradient compression: powersgd (rank 4, plain all-reduce for the first 10 steps): DDP comm "
                    "hook powerSGD_hook (error feedback, warm start)",
                    "gradient accumulation: 2 micro-batches per synchronization: DDP's no_sync() on 1 of every 2 "
                    "micro-batches; the optimizer steps every 2 calls",
                    "gradient buckets: 50 MB: DDP's bucket_cap_mb"], result.stdout


def test_explain_prints_the_plan_and_starts_nothing():
    result = entrypoint({"EXPLAIN": "1", "FRAMEWORK": "tensorflow", "NUM_NODES": "2", "ROLE": "master",
                         "MASTER_ADDR": "10.1.2.3", "NPROC_PER_NODE": "2"})
    assert result.returncode == 0, result.stderr
    assert "MultiWorkerMirroredStrategy" in result.stdout and "TF_CONFIG=" in result.stdout
    assert "job store 10.1.2.3:29500" in result.stdout


def test_a_misspelt_variable_warns_in_the_dry_run_with_the_likely_name():
    result = entrypoint({"FRAMWORK": "tensorflow", "LR": "0.1"}, "--dry-run")
    assert result.returncode == 0, result.stderr
    warned = [line for line in (result.stdout + result.stderr).splitlines() if "not a variable" in line]
    assert len(warned) == 1 and "FRAMWORK is not a variable of this image; did you mean FRAMEWORK?" in warned[0]


@pytest.mark.parametrize("env", [{"NET_IFNAME": "eth9"}, {"NET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "eth0"}])
def test_the_dry_run_refuses_what_the_real_run_refuses(env):
    result = entrypoint(env, "--dry-run")
    assert result.returncode == 2 and "NET_IFNAME=" in result.stderr and len(result.stderr.splitlines()) == 1, \
        result.stdout[-2000:] + result.stderr


def test_dry_run_flag_and_script_arguments():
    result = entrypoint({"NPROC_PER_NODE": "2"}, "--dry-run", "--steps", "7")
    assert result.returncode == 0 and "--standalone" in result.stdout and "--steps 7" in result.stdout


def manifest(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text('{"frameworks": ["pytorch", "tensorflow", "keras"], "launchers": ["native", "horovod", "mpi"]}')
    return str(path)


def test_a_program_after_the_image_runs_in_place_with_the_training_environment(tmp_path):
    result = entrypoint({"FRAMEWORK": "keras", "NET_IFNAME": "eth9", "DISTTRAIN_MANIFEST": manifest(tmp_path)},
                        "sh", "-c", 'echo "$TF_USE_LEGACY_KERAS $NCCL_SOCKET_IFNAME $OMP_NUM_THREADS"; exit 5')
    assert result.returncode == 5, result.stderr          # the program's own exit code: it replaced us
    keras, iface, threads = result.stdout.split()
    assert (keras, iface) == ("1", "eth9") and int(threads) >= 1
    # The training script exists (ENTRYPOINT): one line says which ran and how to pass the word to it.
    assert "put -- before it" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_program_with_bad_variables_starts_nothing(tmp_path):
    result = entrypoint({"FRAMEWORK": "jax", "DISTTRAIN_MANIFEST": manifest(tmp_path)}, "sh", "-c", "echo RAN")
    assert result.returncode == 2 and "RAN" not in result.stdout and "FRAMEWORK" in result.stderr


def test_dry_run_of_a_program_and_of_a_forced_script_argument(tmp_path):
    env = {"DISTTRAIN_MANIFEST": manifest(tmp_path), "NPROC_PER_NODE": "2"}
    result = entrypoint(env, "--dry-run", "sh", "-c", "true")
    assert result.returncode == 0 and "runs:  sh -c true" in result.stdout and "OMP_NUM_THREADS=" in result.stdout
    result = entrypoint(env, "--dry-run", "--", "sh")
    assert result.returncode == 0 and re.search(r"entrypoint.launchers.torchrun.run .*train\.py sh$", result.stdout, re.M)


def test_the_dry_run_of_a_job_on_etcd_says_no_node_hosts_it_and_who_can_reach_it():
    result = entrypoint({"JOB_STORE": "etcd://e1:2379,10.0.0.2:2379", "MIN_NODES": "1", "MAX_NODES": "3",
                         "MAX_RESTARTS": "3"}, "--dry-run")
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "role=peer" in out and "which no node hosts" in out
    assert "--rdzv-backend=etcd-v3 --rdzv-endpoint=http://e1:2379,http://10.0.0.2:2379" in out
    assert "anyone who reaches etcd's client port" in out and "MASTER_PORT" not in out
