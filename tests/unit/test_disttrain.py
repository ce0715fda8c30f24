"""The in-image API's pure parts: who am I, learning-rate scaling, checkpoints."""

import json
import math
import os

import pytest

from disttrain import checkpoint
from disttrain.env import RankInfo
from disttrain.lr import scale_lr, warmup_factor, warmup_lr


def test_rank_from_torchrun():
    info = RankInfo.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                              "TP_SIZE": "2", "DP_SIZE": "2", "PARALLEL_MODE": "hybrid"})
    assert (info.rank, info.world_size, info.local_rank, info.node_rank) == (3, 4, 1, 1)
    assert (info.tp_size, info.dp_size, info.parallel_mode) == (2, 2, "hybrid")
    assert not info.is_main


def test_rank_from_horovod_and_mpirun():
    assert RankInfo.from_env({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}).world_size == 2
    assert RankInfo.from_env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}).rank == 2


def test_rank_from_tf_config():
    tf_config = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 1}}
    info = RankInfo.from_env({"TF_CONFIG": json.dumps(tf_config)})
    assert (info.rank, info.world_size) == (2, 3)


def test_single_process_defaults():
    info = RankInfo.from_env({})
    assert (info.rank, info.world_size, info.dp_size) == (0, 1, 1) and info.is_main


def test_lr_scaling():
    assert scale_lr(0.1, 8) == pytest.approx(0.8)
    assert scale_lr(0.1, 4, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 4, "none") == 0.1
    with pytest.raises(ValueError, match="allowed: linear, sqrt, none"):
        scale_lr(0.1, 4, "cubic")
    assert [warmup_factor(s, 4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert warmup_lr(0, 0.1, 4, 4) == pytest.approx(0.1 + 0.3 * 0.25)
    assert warmup_lr(10, 0.1, 4, 4) == pytest.approx(0.4)
    assert math.isclose(warmup_lr(0, 0.1, 4, 0), 0.4)


def test_checkpoint_rank0_writes_everyone_reads(tmp_path):
    assert checkpoint.save({"w": 1}, 10, directory=str(tmp_path), rank=1) is None
    assert checkpoint.latest(str(tmp_path)) is None
    checkpoint.save({"w": 1}, 10, directory=str(tmp_path), rank=0)
    checkpoint.save({"w": 2}, 20, directory=str(tmp_path), rank=0)
    assert checkpoint.load_latest(str(tmp_path)) == (20, {"w": 2})


def test_checkpoint_keeps_the_last_few_and_leaves_no_temp_files(tmp_path):
    for step in range(1, 6):
        checkpoint.save({"step": step}, step, directory=str(tmp_path), rank=0, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000004.pkl", "ckpt-00000005.pkl"]


def test_checkpoint_pruning_counts_each_kind_and_never_sees_temporary_names(tmp_path):
    for name in ("ckpt-00000010.pt", "ckpt-00000020.pt", "ckpt-00000030.pt", ".ckpt-00000040.pt.tmp-7",
                 "ckpt-00000005.dcp", "ckpt-00000025.dcp", ".ckpt-00000035.dcp.tmp", "notes.txt"):
        (tmp_path / name).touch()
    assert checkpoint.checkpoints(tmp_path, "pt") == [(10, "ckpt-00000010.pt"), (20, "ckpt-00000020.pt"),
                                                      (30, "ckpt-00000030.pt")]
    assert checkpoint.latest(str(tmp_path)) == (30, tmp_path / "ckpt-00000030.pt")
    assert checkpoint.latest(str(tmp_path), "dcp") == (25, tmp_path / "ckpt-00000025.dcp")
    assert checkpoint.to_remove(checkpoint.checkpoints(tmp_path, "pt"), 2) == ["ckpt-00000010.pt"]
    assert checkpoint.to_remove(checkpoint.checkpoints(tmp_path, "pt"), 0) == []


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")       # one process, on purpose
def test_sharded_checkpoint_saves_loads_keeps_the_last_few_and_ignores_a_crashed_save(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()                                    # momentum buffers: optimizer state to save
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    for step in (10, 20, 30):
        checkpoint.save_sharded(step, model, optimizer, directory=str(tmp_path), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000020.dcp", "ckpt-00000030.dcp"]

    # A save that died mid-write leaves only its temporary folder: 'latest' never sees it.
    crashed = tmp_path / ".ckpt-00000040.dcp.tmp"
    crashed.mkdir()
    (crashed / "__0_0.distcp").write_bytes(b"trunc")
    fresh = torch.nn.Linear(4, 2)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    assert checkpoint.load_sharded(fresh, fresh_opt, directory=str(tmp_path)) == 30
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())
    assert torch.equal(fresh_opt.state_dict()["state"][0]["momentum_buffer"],
                       optimizer.state_dict()["state"][0]["momentum_buffer"])
    # The replicated API never picks a sharded folder, and a new save replaces the debris.
    assert checkpoint.load_latest(str(tmp_path)) is None
    checkpoint.save_sharded(40, model, directory=str(tmp_path), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000030.dcp", "ckpt-00000040.dcp"]
    assert checkpoint.load_sharded(torch.nn.Linear(4, 2), directory=str(tmp_path / "empty")) == 0


def test_tf_chief_is_the_chief_task_or_worker_0(monkeypatch):
    from disttrain import tf as dtf

    for task, chief in (({"type": "chief", "index": 0}, True), ({"type": "worker", "index": 0}, True),
                        ({"type": "worker", "index": 1}, False), ({"type": "ps", "index": 0}, False)):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {}, "task": task}))
        assert dtf.is_chief() is chief
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    assert dtf.is_chief() is False


def test_launch_runs_here_unless_pytorch_xla_starts_per_host(monkeypatch):
    dt = pytest.importorskip("disttrain.torch")
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    calls = []
    dt.launch(calls.append, 7)
    assert calls == [7] and not dt.uses_xla()
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    with pytest.raises(RuntimeError, match="one XLA CPU device per process"):
        dt.launch(calls.append, 8)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")              # under torchrun: one process per device
    dt.launch(calls.append, 9)
    assert calls == [7, 9]


def test_to_cpu_copies_nested_state():
    dt = pytest.importorskip("disttrain.torch")
    import torch
    state = {"model": {"w": torch.ones(2, requires_grad=True)}, "steps": [torch.zeros(1), 3], "lr": 0.1}
    copied = dt.to_cpu(state)
    assert copied["model"]["w"].requires_grad is False and copied["steps"][1] == 3 and copied["lr"] == 0.1


def test_mxnet_kvstore_type_follows_the_launch():
    from disttrain.mxnet import kvstore_type

    worker = {"DMLC_ROLE": "worker"}
    assert kvstore_type(RankInfo.from_env({"SYNC_MODE": "sync"}), worker) == "dist_sync"
    assert kvstore_type(RankInfo.from_env({"SYNC_MODE": "async"}), worker) == "dist_async"
    assert kvstore_type(RankInfo.from_env({}), {}) == "local"          # a plain process: no servers
    with pytest.raises(RuntimeError, match="no Horovod kvstore"):
        kvstore_type(RankInfo.from_env({"LAUNCHER": "horovod"}), {})
def test_keras_backup_resumes_where_training_stopped_and_only_rank_0_writes(tmp_path, monkeypatch):
    """disttrain.tf.backup_and_restore with real tf-keras in one process: a fit interrupted
    after 14 steps resumes at the step-10 backup; the final step is backed up too; a second
    rank (Horovod, mpirun: no multi-worker strategy) restores but never writes."""
    pytest.importorskip("tf_keras")
    import numpy as np
    from disttrain import tf as dtf

    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    keras = dtf.keras()
    x, y = np.ones((256, 4), np.float32), np.zeros((256, 1), np.float32)     # 32 batches

    def fit(steps, *callbacks):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        seen = []
        count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, _: seen.append(batch))
        model.fit(x, y, batch_size=8, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[*callbacks, count])
        return seen

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 13:
                raise RuntimeError("killed")

    folder = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="killed"):
        fit(25, dtf.backup_and_restore(every=10, directory=folder), Crash())
    restored = []
    assert fit(25, dtf.backup_and_restore(every=10, directory=folder, on_restore=restored.append)) == \
        list(range(10, 25))
    assert restored == [10]
    again = dtf.backup_and_restore(every=10, directory=folder)
    assert fit(25, again) == [] and again.resumed_step == 25               # the final step was backed up

    monkeypatch.setenv("RANK", "1")
    other = str(tmp_path / "rank1")
    assert fit(25, dtf.backup_and_restore(every=10, directory=other)) == list(range(25))
    assert not os.path.exists(os.path.join(other, "chief", "checkpoint"))   # rank 0 writes, not rank 1


def test_preemption_turns_sigterm_into_a_flag_the_loop_reads_then_leaves_with_143():
    import signal
    import subprocess
    import sys

    # Its own process: catch() replaces this interpreter's SIGTERM handler for good.
    code = ("import os, signal, sys\n"
            "from disttrain import preemption, torch as dt\n"
            "assert not dt.stop_requested()\n"
            "preemption.catch()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "assert preemption.requested() and dt.stop_requested()\n"
            "print('checkpointing', flush=True)\n"
            "preemption.leave()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-2000:]
    assert done.stdout == "checkpointing\n"
    assert "PREEMPTION signal SIGTERM" in done.stderr


def test_finish_tears_down_the_group_flushes_and_exits_without_the_interpreters_teardown(tmp_path):
    """A one-rank gloo group: finish() destroys it (the barrier, then destroy_process_group),
    flushes what was printed without flush, and exits with the code given; atexit handlers,
    part of the teardown it skips, do not run."""
    import subprocess
    import sys

    from testing.ports import free_port

    code = ("import atexit, os\n"
            "import torch.distributed as dist\n"
            "from disttrain import torch as dt\n"
            f"os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{free_port()}', RANK='0', WORLD_SIZE='1')\n"
            "dist.init_process_group('gloo')\n"
            "destroy = dist.destroy_process_group\n"
            "dist.destroy_process_group = lambda: (print('destroyed', end=' '), destroy())\n"
            "atexit.register(print, 'atexit ran')\n"
            "print('trained', end=' ')\n"
            "dt.finish(7)\n"
            "print('after finish')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]
    assert done.stdout == "trained destroyed "


def test_a_rank_that_mpirun_or_horovodrun_started_on_one_host_meets_the_others_on_loopback():
    torch_helpers = pytest.importorskip("disttrain.torch")
    mpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert torch_helpers._one_host_rendezvous(RankInfo.from_env(mpi), mpi) == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}
    alone = torch_helpers._one_host_rendezvous(RankInfo.from_env({}), {"MASTER_PORT": "4000"})
    assert alone == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4000", "RANK": "0", "WORLD_SIZE": "1"}
    srun = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NNODES": "1"}
    assert torch_helpers._one_host_rendezvous(RankInfo.from_env(srun), srun)["RANK"] == "3"
    across = {**mpi, "OMPI_COMM_WORLD_SIZE": "4"}
    with pytest.raises(RuntimeError, match="more than one host .* set MASTER_ADDR"):
        torch_helpers._one_host_rendezvous(RankInfo.from_env(across), across)


def test_gradsync_sets_horovods_arguments_a_script_left_at_their_defaults_and_keeps_its_choices(capsys):
    """Horovod's own examples pass compression=hvd.Compression.none explicitly: no choice,
    the job's setting applies; a value of the script's own is kept and said."""
    import types

    from disttrain import gradsync

    def distributed_optimizer(optimizer, compression="none", backward_passes_per_step=1):
        return compression, backward_passes_per_step

    module = types.SimpleNamespace(DistributedOptimizer=distributed_optimizer)
    gradsync._said.clear()
    gradsync._with_defaults(module, "DistributedOptimizer", {"compression": "fp16", "backward_passes_per_step": 4},
                            {"compression": "fp16 compression", "backward_passes_per_step": "accumulation of 4"})
    assert module.DistributedOptimizer("opt") == ("fp16", 4)
    assert module.DistributedOptimizer("opt", compression="none") == ("fp16", 4)
    assert module.DistributedOptimizer("opt", "none", 2) == ("fp16", 2)
    said = capsys.readouterr().err
    assert "disttrain: gradients: fp16 compression\n" in said
    assert "accumulation of 4 not applied: the script passes backward_passes_per_step=2" in said


GRAD_SCALER_LOOP = r'''
import os, sys
from disttrain import gradsync
gradsync.install({"GRAD_ACCUMULATION": "4"})
import torch

torch.manual_seed(0)
xs, ys = torch.randn(4, 8, 6), torch.randn(4, 8, 1)
make = lambda: torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
torch.manual_seed(1); reference = make()
torch.manual_seed(1); model = make()

# The reference: one step on the combined batch, its gradient clipped to norm 0.05 by hand.
grads = torch.autograd.grad(torch.nn.functional.mse_loss(reference(xs.reshape(32, 6)), ys.reshape(32, 1)),
                            list(reference.parameters()))
norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
expected = [p - 0.1 * g * min(1.0, 0.05 / (norm.item() + 1e-6)) for p, g in zip(reference.parameters(), grads)]

# The script's loop as written for AMP with clipping, one micro-batch per call.
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for k in range(4):
    optimizer.zero_grad()
    scaler.scale(torch.nn.functional.mse_loss(model(xs[k]), ys[k])).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    scaler.step(optimizer)
    scaler.update()
    print("SCALE", k, scaler.get_scale())
diff = max((p - e).abs().max().item() for p, e in zip(model.parameters(), expected))
print("DIFF", diff)
'''


def test_accumulation_with_amps_grad_scaler_and_clipping_is_one_clipped_step_on_the_combined_batch():
    """GradScaler's unscale_/step/update and clip_grad_norm_ in the loop, with GRAD_ACCUMULATION=4:
    the four scaled micro-batches are unscaled once, clipped once and applied once."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, "-c", GRAD_SCALER_LOOP], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    diff = float(out.stdout.split("DIFF ")[1])
    assert diff < 1e-6, out.stdout


def test_powersgds_narrow_products_on_cpu_are_torchs_own_numbers_and_its_module_keeps_torch():
    """gradsync gives powerSGD_hook's module a torch whose bmm computes M·Q and Mᵀ·P (a CPU
    product with a narrow right side) as (Qᵀ·Mᵀ)ᵀ and (Pᵀ·M)ᵀ: the same products to float32
    rounding, into the same `out`; any other bmm, and every other name, is torch's."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from disttrain import gradsync

    gradsync._narrow_products_on_cpu(powerSGD_hook)
    gradsync._narrow_products_on_cpu(powerSGD_hook)             # once only
    patched = powerSGD_hook.torch
    assert isinstance(patched, gradsync._TorchWithNarrowProducts) and patched._torch is torch
    assert patched.float32 is torch.float32 and patched.cuda is torch.cuda
    g = torch.Generator().manual_seed(0)
    m, p, q = torch.randn(2, 300, 500, generator=g), torch.randn(2, 300, 4, generator=g), torch.randn(2, 500, 4, generator=g)
    for a, b in ((m.transpose(1, 2), p), (m, q)):
        out = torch.empty(2, a.shape[1], 4)
        assert patched.bmm(a, b, out=out) is out
        assert torch.allclose(out, torch.bmm(a, b), rtol=1e-5, atol=1e-4)
    wide, out = torch.randn(2, 300, 200, generator=g), torch.empty(2, 500, 200)      # not narrow: torch's path
    assert torch.equal(patched.bmm(m.transpose(1, 2), wide, out=out), torch.bmm(m.transpose(1, 2), wide))


def test_disttrain_imports_nothing_of_the_entrypoint():
    """The library the training imports stands below the entrypoint (docs/design.md): the
    entrypoint reads its formats (checkpoint names, progress, status, GradSync), never the
    other way round, at the top of a module or inside a function."""
    import ast

    from tests.conftest import ROOT
    found = []
    for path in sorted((ROOT / "disttrain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "entrypoint"]
    assert not found, found
