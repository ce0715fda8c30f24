"""Gradient strategies (GRAD_COMPRESSION, GRAD_ACCUMULATION, GRAD_BUCKET_MB) in real jobs of
two nodes on loopback, through the entrypoint, on a script that uses only the frameworks'
own APIs (grad_sync_steps.py): the setting shows in the synchronized gradients themselves
(fp16/bf16-exact values, PowerSGD's low rank), in the running DDP, and in the first update,
which equals one step on the combined batch; training converges and the replicas agree.
"""

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = str(ROOT / "tests/e2e/grad_sync_steps.py")
KERAS = str(ROOT / "tests/e2e/grad_sync_keras.py")


def lines(output: str, kind: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", m)) for m in re.findall(rf"^.*{kind} (rank=.*)$", output, re.M)]


def grads(output: str, step: int) -> list[dict[str, str]]:
    return [g for g in lines(output, "GRADS") if int(g["step"]) == step]


def check_converged(output: str, world: int = 2) -> None:
    done = lines(output, "DONE")
    assert len(done) == world, output[-3000:]
    assert len({d["digest"] for d in done}) == 1, done                # the replicas agree
    for d in done:
        assert float(d["after"]) < 0.2 * float(d["before"]), d


CASES = {
    # GRAD_COMPRESSION: what every synchronized gradient must show at the last step (bf16 on
    # Gloo, as NCCL, sums bfloat16).
    "fp16": lambda g: g["fp16"] == "1",
    "bf16": lambda g: g["bf16"] == "1",
    "powersgd": lambda g: int(g["weight_rank"]) <= 2,
}


@pytest.mark.parametrize("compression", list(CASES))
def test_ddp_compression_shows_in_the_gradients_and_training_converges(jobs, compression):
    codes, output = jobs.run(2, ["--steps", "40", "--wide", "600"], ENTRYPOINT=SCRIPT, GRAD_COMPRESSION=compression,
                             POWERSGD_RANK=2, POWERSGD_WARMUP=5, GRAD_BUCKET_MB=1)
    assert codes == [0, 0], output[-4000:]
    hooks = lines(output, "HOOKS")
    name = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook_on_gloo", "powersgd": "powerSGD_hook"}
    assert [h["ddp_hooks"] for h in hooks] == [name[compression]] * 2
    assert {h["bucket_bytes"] for h in hooks} == {str(1024 * 1024)}
    assert all(int(h["buckets"]) >= 2 for h in hooks), hooks          # several hooks' chains at once
    assert "disttrain: gradients: " in output
    last = grads(output, 39)
    assert len(last) == 2 and all(CASES[compression](g) for g in last), last
    check_converged(output)


def test_ddp_under_mpirun_gets_the_same_strategies(jobs):
    """LAUNCHER=mpi: the ranks mpirun starts build the same DDP, and get the same hook and
    accumulation: PowerSGD after its warm-up, the first update the combined batch's."""
    codes, output = jobs.run(1, ["--steps", "16"], ENTRYPOINT=SCRIPT, LAUNCHER="mpi", NPROC_PER_NODE=2,
                             GRAD_COMPRESSION="powersgd", POWERSGD_RANK=1, POWERSGD_WARMUP=4, GRAD_ACCUMULATION=2)
    assert codes == [0], output[-4000:]
    assert [h["ddp_hooks"] for h in lines(output, "HOOKS")] == ["powerSGD_hook"] * 2, output[-3000:]
    last = grads(output, 15)
    assert len(last) == 2 and all(int(g["weight_rank"]) == 1 for g in last), last
    first = lines(output, "FIRST")
    # float32 rounding: the 8 micro-batches' gradients summed in another order (CI saw 2.3e-6);
    # a step on the wrong gradient (local, summed, unscaled) is off by 1e-3 or more.
    assert len(first) == 2 and all(float(f["max_diff"]) < 1e-5 for f in first), first
    check_converged(output)


def test_with_the_defaults_the_same_checks_fail(jobs):
    """The control: the same script with the defaults and 4 micro-batches of its own per
    update: full-precision, full-rank gradients, no hook, and a first update that is not the
    combined-batch step (each micro-batch stepped)."""
    codes, output = jobs.run(2, ["--steps", "30", "--micro", "4"], ENTRYPOINT=SCRIPT)
    assert codes == [0, 0], output[-4000:]
    assert [h["ddp_hooks"] for h in lines(output, "HOOKS")] == ["none", "none"]
    last = grads(output, 29)
    assert len(last) == 2
    assert all(g["fp16"] == "0" and g["bf16"] == "0" and int(g["weight_rank"]) > 2 for g in last), last
    assert all(float(f["max_diff"]) > 1e-3 for f in lines(output, "FIRST")), output[-3000:]
    assert len({m["grad"] for m in lines(output, "MICRO")}) == 1            # every micro-batch synchronized
    assert "disttrain: gradients: " not in output


@pytest.mark.parametrize("launcher", ["native", "horovod"])
def test_accumulation_equals_one_step_on_the_combined_batch(jobs, launcher):
    """4 micro-batches per update on each of 2 nodes: the first micro-batch's gradient stays
    local (no synchronization), the first update is one SGD step on all 8 micro-batches
    together (to float32 rounding); then the job trains to the end."""
    codes, output = jobs.run(2, ["--steps", "30"], ENTRYPOINT=SCRIPT, LAUNCHER=launcher, GRAD_ACCUMULATION=4)
    assert codes == [0, 0], output[-4000:]
    first = lines(output, "FIRST")
    # float32 rounding: the 8 micro-batches' gradients summed in another order (CI saw 2.3e-6);
    # a step on the wrong gradient (local, summed, unscaled) is off by 1e-3 or more.
    assert len(first) == 2 and all(float(f["max_diff"]) < 1e-5 for f in first), first
    micro = lines(output, "MICRO")
    assert len(micro) == 2 and micro[0]["grad"] != micro[1]["grad"], micro  # not synchronized: still local
    check_converged(output)


def test_horovod_fp16_compression_shows_in_the_gradients(jobs):
    codes, output = jobs.run(2, ["--steps", "40"], ENTRYPOINT=SCRIPT, LAUNCHER="horovod", GRAD_COMPRESSION="fp16",
                             GRAD_BUCKET_MB=8)
    assert codes == [0, 0], output[-4000:]
    assert [f["threshold"] for f in lines(output, "FUSION")] == [str(8 * 1024 * 1024)] * 2
    assert "disttrain: gradients: fp16 compression (hvd.Compression.fp16)" in output
    last = grads(output, 39)
    assert len(last) == 2 and all(g["fp16"] == "1" for g in last), last
    check_converged(output)


def test_keras_accumulation_is_horovods_aggregation_and_equals_the_combined_batch_step(jobs):
    codes, output = jobs.run(2, [], ENTRYPOINT=KERAS, FRAMEWORK="keras", LAUNCHER="horovod", GRAD_ACCUMULATION=2)
    assert codes == [0, 0], output[-4000:]
    assert [a["passes"] for a in lines(output, "AGG")] == ["2", "2"]
    first = lines(output, "FIRST")
    # float32 rounding: the 8 micro-batches' gradients summed in another order (CI saw 2.3e-6);
    # a step on the wrong gradient (local, summed, unscaled) is off by 1e-3 or more.
    assert len(first) == 2 and all(float(f["max_diff"]) < 1e-5 for f in first), first
    assert [g["fp16"] for g in lines(output, "GRADS")] == ["0", "0"]
    assert [g["fp16"] for g in lines(output, "KERAS")] == ["0", "0"]


def test_keras_fp16_compression_shows_in_the_optimizers_own_allreduce(jobs):
    codes, output = jobs.run(2, [], ENTRYPOINT=KERAS, FRAMEWORK="keras", LAUNCHER="horovod", GRAD_COMPRESSION="fp16")
    assert codes == [0, 0], output[-4000:]
    assert [g["fp16"] for g in lines(output, "KERAS")] == ["1", "1"], output[-3000:]
    assert all(float(f["max_diff"]) < 1e-3 for f in lines(output, "FIRST")), output[-3000:]   # and it trains


def test_tensorflow_fp16_compression_shows_in_the_gradient_tapes_gradients(jobs):
    """And the control for accumulation: two batches without it are two steps."""
    codes, output = jobs.run(2, ["--batches", "2"], ENTRYPOINT=KERAS, FRAMEWORK="tensorflow", LAUNCHER="horovod",
                             GRAD_COMPRESSION="fp16")
    assert codes == [0, 0], output[-4000:]
    assert [g["fp16"] for g in lines(output, "GRADS")] == ["1", "1"]
    assert [a["passes"] for a in lines(output, "AGG")] == ["1", "1"]
    assert all(float(f["max_diff"]) > 1e-4 for f in lines(output, "FIRST")), output[-3000:]
