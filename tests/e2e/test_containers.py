"""Multi-node training in real containers: docker run, compose two-node, and faults.

The image is the one build.py built (TEST_IMAGE); the code is this repository's
examples/, mounted at /app/code exactly as a user mounts theirs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from testcontainers.core.container import DockerContainer

from tests.conftest import ROOT
from testing.census import container_listeners, described
from testing.results import changes, initial_loss, results
from tests.e2e.docker_env import IMAGE, ComposeProject, Swarm, SwarmStack, compose_command, docker

pytestmark = [pytest.mark.docker, pytest.mark.e2e]


def assert_replicas_agree(output: str, world: int) -> None:
    found = results(output)
    assert sorted(r.rank for r in found) == list(range(world)), output[-4000:]
    assert len({r.digest for r in found}) == 1, [(r.rank, r.digest) for r in found]
    assert all(r.after < 0.5 * r.before for r in found), found


def run_to_end(container: DockerContainer, timeout: float) -> tuple[int, str]:
    """Start the container, wait for it to exit; its exit code and output. Removed either way."""
    container.start()
    try:
        wrapped = container.get_wrapped_container()
        status = wrapped.wait(timeout=timeout)
        return status["StatusCode"], wrapped.logs().decode()
    finally:
        container.stop()


HOST_UID = 4321                                       # a host user that is neither root nor the image's uid


def readme_first_command() -> str:
    """The README's first shell block under "### One node", up to its first blank line."""
    block = re.search(r"### One node\n+```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return block.split("\n\n")[0]


def run_as_host_user(script: str, image: str) -> tuple[subprocess.CompletedProcess, str]:
    """`script` in bash, as HOST_UID with access to Docker's socket, in a fresh folder of its
    own holding my_code/ (the bundled examples, as the README's comment says): the result
    and the folder."""
    home = tempfile.mkdtemp(prefix="readme-", dir="/tmp")
    shutil.copytree(ROOT / "examples", f"{home}/my_code", ignore=shutil.ignore_patterns("__pycache__"))
    os.chown(home, HOST_UID, HOST_UID)
    socket_group = os.stat("/var/run/docker.sock").st_gid
    script = script.replace("distributed-training-framework:cpu", image)
    done = subprocess.run(["setpriv", f"--reuid={HOST_UID}", f"--regid={HOST_UID}", f"--groups={socket_group}",
                           "bash", "-e", "-c", script], cwd=home, capture_output=True, text=True, timeout=300,
                          env={"PATH": os.environ["PATH"], "HOME": home})
    return done, home


@pytest.mark.skipif(os.getuid() != 0 or not os.path.exists("/var/run/docker.sock"),
                    reason="runs Docker as another host user: needs root (setpriv) and the local socket")
def test_the_readmes_first_command_trains_as_written_by_a_non_root_user(image):
    """The README's first block, verbatim, by a host user that is neither root nor uid 1000:
    two ranks train and the checkpoints on the host are that user's. Without its `mkdir`,
    Docker makes ckpt/ as root and the entrypoint says so, and what to do, in one line."""
    command = readme_first_command()
    assert command.startswith("# CPU") and re.search(r"^mkdir -p data ckpt\b", command, re.M), command
    done, home = run_as_host_user(command, image)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert_replicas_agree(done.stdout + done.stderr, 2)
        saved = list(os.scandir(f"{home}/ckpt"))
        assert saved and {entry.stat().st_uid for entry in saved} == {HOST_UID}, [e.name for e in saved]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    without_mkdir = "\n".join(line for line in command.splitlines() if not line.startswith("mkdir "))
    done, home = run_as_host_user(without_mkdir, image)
    try:
        assert done.returncode == 2 and done.stdout == "", done.stdout[-2000:] + done.stderr[-2000:]
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"entrypoint: CHECKPOINT_DIR='/app/checkpoints': not writable by uid {HOST_UID} "
                               f"(Permission denied; the folder belongs to root: "), line
        assert 'run with --user "$(id -u):$(id -g)"' in line, line
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_docker_run_local_two_processes_under_horovod_writes_one_checkpoint(image, tmp_path):
    """One container, two processes. LAUNCHER=horovod on one CPU node runs Horovod's MPI
    controller under mpirun (Open MPI's shared memory between the ranks, inside Docker's
    default seccomp profile), and the preflight line says so. (LAUNCHER=native: the
    README's first command, above.)"""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    os.chmod(checkpoints, 0o777)                      # the image runs as uid 1000
    container = (DockerContainer(image)
                 .with_env("FRAMEWORK", "pytorch").with_env("TRAIN_MODE", "local").with_env("NPROC_PER_NODE", "2")
                 .with_env("LAUNCHER", "horovod")
                 .with_volume_mapping(str(ROOT / "examples"), "/app/code", "ro")
                 .with_volume_mapping(str(checkpoints), "/app/checkpoints", "rw")
                 .with_command("--steps 40 --checkpoint-every 1000"))
    code, output = run_to_end(container, timeout=300)
    assert code == 0, output[-3000:]
    assert "LAUNCHER=horovod (Horovod over MPI: Open MPI shared memory)" in output, output[:3000]
    assert_replicas_agree(output, 2)
    # mpirun's tags become the one rank prefix, each line whole (rank_lines.py, disttrain/output.py)
    assert re.search(r"^\[rank0\]: RESULT ", output, re.M) and re.search(r"^\[rank1\]: RESULT ", output, re.M), output
    assert "<stdout>" not in output and "<stderr>" not in output, output[-3000:]
    assert [p.name for p in checkpoints.iterdir()] == ["horovod_torch.pt"]      # rank 0 only, once


def test_a_read_only_image_as_another_uid_needs_only_a_writable_checkpoint_dir(image, tmp_path):
    """As Apptainer and OpenShift run it: read-only, an arbitrary uid (whose HOME is /).
    Refused in one line before anything starts while CHECKPOINT_DIR, or a cache variable
    that is set, cannot be written; with a checkpoint folder PyTorch and Keras train, their
    caches in a private HOME in /dev/shm."""
    run = ["docker", "run", "--rm", "--read-only", "--user", "12345:12345", "-e", "NPROC_PER_NODE=2",
           "-v", f"{ROOT / 'examples'}:/app/code:ro"]
    refused = subprocess.run([*run, image, "--steps", "20"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout[-2000:] + refused.stderr[-2000:]
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("entrypoint: CHECKPOINT_DIR='/app/checkpoints': not writable by uid 12345 "), line
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    checkpoints.chmod(0o777)
    run += ["-v", f"{checkpoints}:/app/checkpoints"]
    cache = subprocess.run([*run, "-e", "KERAS_HOME=/opt/keras", image], capture_output=True, text=True, timeout=300)
    assert cache.returncode == 2 and cache.stderr.startswith("entrypoint: KERAS_HOME='/opt/keras' "), cache.stderr
    for framework in ("pytorch", "keras"):         # Keras writes ~/.keras, Matplotlib ~/.config at import
        trained = subprocess.run([*run, "-e", f"FRAMEWORK={framework}", image, "--steps", "20"],
                                 capture_output=True, text=True, timeout=300)
        output = trained.stdout + trained.stderr
        assert trained.returncode == 0, output[-3000:]
        assert "entrypoint: HOME='/' is not writable by uid 12345: HOME=/dev/shm/" in output, output[:3000]
        assert_replicas_agree(output, 2)
    assert any(p.name.startswith("ckpt-") for p in checkpoints.iterdir())


def test_docker_stop_checkpoints_within_the_grace_period_and_a_restart_resumes(image, tmp_path):
    """`docker stop -t 30` (SIGTERM, SIGKILL 30 s later), as a preemption or a drained node
    does: the two ranks agree on a step, checkpoint it and the container exits 143 long
    before the SIGKILL; started again, it resumes from that step to the end."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    checkpoints.chmod(0o777)
    name = f"dtftest-preempt-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--name", name, "-e", "NPROC_PER_NODE=2", "-e", "GRACE_PERIOD=20",
           "-v", f"{ROOT / 'examples'}:/app/code:ro", "-v", f"{checkpoints}:/app/checkpoints",
           image, "--steps", "800", "--step-delay", "0.02")
    try:
        deadline = time.monotonic() + 180
        while "step 100 " not in docker("logs", name).stdout and time.monotonic() < deadline:
            time.sleep(0.5)
        started = time.monotonic()
        docker("stop", "-t", "30", name)
        took = time.monotonic() - started
        logs = docker("logs", name)
        first = logs.stdout + logs.stderr
        assert docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "143", first[-3000:]
        assert took < 20, f"docker stop took {took:.1f}s"
        assert "Traceback" not in first and "SignalException" not in first, first[-3000:]     # the stop, the checkpoint, the exit
        steps = set(re.findall(r"PREEMPTED rank=\d checkpoint_step=(\d+)", first))
        assert len(steps) == 1 and len(re.findall("PREEMPTED rank=", first)) == 2, first[-3000:]
        step = int(steps.pop())
        assert 100 < step < 800 and (checkpoints / f"ckpt-{step:08d}.pt").exists()

        docker("start", name)
        assert docker("wait", name, timeout=300).stdout.strip() == "0"
        both = docker("logs", name)
        second = both.stdout[len(logs.stdout):] + both.stderr[len(logs.stderr):]
        assert f"RESUMED rank=0 step={step}" in second and f"RESUMED rank=1 step={step}" in second, second[-3000:]
        assert_replicas_agree(second, 2)
    finally:
        docker("rm", "-f", name, check=False)


# What each container of a two-node job with a secret listens on where other hosts reach
# it while training, as docs/security.md lists it: the master's Gates (on every interface),
# and under torchrun the Gloo listener of each rank, on its container's address (NET_IFNAME's,
# eth0 here); Horovod's Gloo listens only while its ranks connect.
REACHABLE_IN_CONTAINERS = {
    "native": Counter({"Gate on MASTER_PORT": 1, "rank, its node's address": 2}),
    "horovod": Counter({"Gate on MASTER_PORT": 1, "Gate on HOROVOD_PORT": 1})}


def container_census(job: ComposeProject) -> Counter:
    """What listens in the project's containers (master first), other than on loopback."""
    ids = [row["ID"] for row in job.containers()]
    addrs = [docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid).stdout.strip()
             for cid in ids]
    return described(container_listeners(ids), addrs, {29500: "MASTER_PORT", 29501: "HOROVOD_PORT"})


# (framework, launcher, with compose/secret.yml): the PyTorch paths run behind JOB_SECRET.
PATHS = [("pytorch", "native", True), ("pytorch", "horovod", True), ("tensorflow", "native", False),
         ("keras", "horovod", False)]


@pytest.mark.parametrize("framework, launcher, secret", PATHS,
                         ids=[f"{f}-{l}" + ("-secret" if s else "") for f, l, s in PATHS])
def test_compose_two_nodes_train_agree_and_resume(image, project, tmp_path, framework, launcher, secret):
    overrides, env = (), {}
    if secret:
        path = tmp_path / "job_secret"
        path.write_text(uuid.uuid4().hex + "\n")
        path.chmod(0o444)                     # the image's user (uid 1000) reads the bind-mounted file
        overrides, env = ("secret.yml",), {"JOB_SECRET_PATH": str(path)}
    train_args = "--steps 40" + " --step-delay 0.2" * secret           # time for a census
    job = project(*overrides, FRAMEWORK=framework, LAUNCHER=launcher, TRAIN_ARGS=train_args, **env)
    with ThreadPoolExecutor(1) as pool:
        up = pool.submit(job.compose, "up", "--abort-on-container-exit", timeout=600)
        if secret:              # while it trains: what other hosts can reach, and nothing else
            job.wait_for_log("step 20 loss", 300, service="master")
            assert container_census(job) == REACHABLE_IN_CONTAINERS[launcher]
        run = up.result()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert set(job.exit_codes().values()) == {0}, job.exit_codes()
    assert_replicas_agree(job.logs(), 2)
    master = job.compose("logs", "--no-color", "master").stdout
    assert ("serving the job store at master:29500 (TLS, JOB_SECRET)" in master) == secret, master[:2000]
    assert ("WARNING: no JOB_SECRET" in master) != secret
    assert "the control plane's relay" not in master, master[-3000:]     # the health check's probes pass unsaid

    again = job.compose("up", "--abort-on-container-exit", timeout=600, TRAIN_ARGS="--steps 60")
    assert again.returncode == 0, again.stdout[-3000:]
    output = job.logs()
    assert set(job.exit_codes().values()) == {0}
    resumed = [line for line in output.splitlines() if "RESUMED" in line and "step=40" in line]
    assert resumed, output[-3000:]
    second = results(output)[-2:]
    assert len({r.digest for r in second}) == 1


def test_scale_workers_with_ranks_from_rendezvous(image, project):
    job = project(LAUNCHER="horovod", NUM_NODES=3, TRAIN_ARGS="--steps 30")
    run = job.compose("up", "--scale", "worker=2", "--abort-on-container-exit", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert set(job.exit_codes().values()) == {0} and len(job.exit_codes()) == 3
    assert_replicas_agree(job.logs(), 3)


def test_killed_worker_container_fails_the_master_within_60s(image, project):
    job = project(TRAIN_ARGS="--steps 100000 --step-delay 0.02 --checkpoint-every 1000000")
    job.compose("up", "-d", check=True)
    job.wait_for_log("TRAINING", 180, service="master")
    time.sleep(3)
    killed = time.monotonic()
    job.compose("kill", "worker", check=True)
    job.wait_exited(90)
    elapsed = time.monotonic() - killed
    codes = job.exit_codes()
    master = next(code for name, code in codes.items() if "master" in name)
    assert master != 0 and elapsed < 60, (elapsed, codes, job.logs()[-3000:])


def test_compose_stop_stops_both_cleanly_within_the_grace_period(image, project):
    job = project(TRAIN_ARGS="--steps 100000 --step-delay 0.02 --checkpoint-every 1000000")
    job.compose("up", "-d", check=True)
    job.wait_for_log("TRAINING", 180, service="worker")
    started = time.monotonic()
    job.compose("stop", check=True, timeout=120)
    elapsed = time.monotonic() - started
    codes = job.exit_codes()
    assert elapsed < 20, elapsed                          # stop_grace_period: no SIGKILL needed
    assert set(codes.values()) <= {143}, (codes, job.logs()[-3000:])
    assert "SIGTERM received" in job.logs()


def test_worker_started_20s_before_the_master_still_joins(image, project):
    job = project(TRAIN_ARGS="--steps 30")
    job.compose("up", "-d", "--no-deps", "worker", check=True)
    time.sleep(20)
    job.compose("up", "-d", "master", check=True)
    job.wait_exited(300)
    assert set(job.exit_codes().values()) == {0}, (job.exit_codes(), job.logs()[-3000:])
    assert_replicas_agree(job.logs(), 2)


# --------------------------------------------------------------------------- commands after the image

SEED = ROOT / "tests" / "e2e" / "seed"


def code_dir(tmp_path, **files: str):
    """A folder to mount at /app/code, writable by the image's user (uid 1000)."""
    folder = tmp_path / "code"
    folder.mkdir()
    for name, text in files.items():
        path = folder / name.replace("__", ".")
        path.write_text(text)
        path.chmod(0o755)
    folder.chmod(0o777)
    return folder


def run_image(*args: str, env: dict | None = None, code=None, stdin: str | None = None, timeout: float = 300,
              user: str | None = None):
    flags = ["--rm", "--shm-size", "512m"] + (["-i"] if stdin is not None else []) + (["--user", user] if user else [])
    for key, value in (env or {}).items():
        flags += ["-e", f"{key}={value}"]
    if code:
        flags += ["-v", f"{code}:/app/code"]
    return subprocess.run(["docker", "run", *flags, IMAGE, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("elastic", [False, True], ids=["fixed-size", "elastic"])
def test_two_containers_on_one_hosts_network_meet_every_time(image, elastic):
    """Two nodes of one job on this host's network (`--network host`, one container per
    GPU), MASTER_ADDR=127.0.0.1: the same address and, in their own PID namespaces, the
    same PID. torch's rendezvous took them for one node in 2 runs of 4 (one timed out, the
    other found the rendezvous closed); each process's node id now differs. Three runs."""
    from concurrent.futures import ThreadPoolExecutor

    from testing.ports import free_port

    def node(role: str, port: int) -> DockerContainer:
        container = (DockerContainer(image).with_kwargs(network_mode="host")
                     .with_env("FRAMEWORK", "pytorch").with_env("TRAIN_MODE", "distributed")
                     .with_env("ROLE", role).with_env("NUM_NODES", "2").with_env("RDZV_TIMEOUT", "40")
                     .with_env("MASTER_ADDR", "127.0.0.1").with_env("MASTER_PORT", str(port))
                     .with_volume_mapping(str(ROOT / "examples"), "/app/code", "ro")
                     .with_command("--steps 20 --checkpoint-every 1000"))
        if elastic:
            container = container.with_env("MIN_NODES", "2").with_env("MAX_NODES", "3")
        return container

    for _ in range(3):
        port = free_port()
        with ThreadPoolExecutor(2) as pool:
            ends = list(pool.map(lambda role: run_to_end(node(role, port), timeout=180), ["master", "worker"]))
        output = "\n".join(out for _, out in ends)
        assert [code for code, _ in ends] == [0, 0], output[-4000:]
        assert_replicas_agree(output, 2)


def test_a_shell_after_the_image_is_a_shell_with_the_training_environment(image):
    shell = run_image("bash", env={"FRAMEWORK": "keras", "NET_IFNAME": "eth0"},
                      stdin="id -u; pwd; echo OMP=$OMP_NUM_THREADS KERAS=$TF_USE_LEGACY_KERAS IF=$GLOO_SOCKET_IFNAME\n"
                            "exit 7\n")
    assert shell.returncode == 7, shell.stderr
    assert shell.stdout.split()[:2] == ["1000", "/app/code"]
    assert re.search(r"OMP=[1-9]\d* KERAS=1 IF=eth0", shell.stdout), shell.stdout
    # -it as users type it: a terminal reaches bash (script(1) gives this test one).
    tty = subprocess.run(["script", "-qec", f"docker run --rm -it {IMAGE} bash -c 'test -t 0 && echo ON-A-TTY'",
                          "/dev/null"], capture_output=True, text=True, timeout=120)
    assert "ON-A-TTY" in tty.stdout, tty.stdout + tty.stderr
    python = run_image("python", "-c", "import horovod.torch, torch; print('PY', torch.__version__)")
    assert python.returncode == 0 and "PY 2." in python.stdout, python.stderr


def test_horovodrun_and_mpirun_inside_the_image_as_documented(image, tmp_path):
    """Horovod's own documented line, as the image's user, without SSH; then plain mpirun.
    Both with a Horovod script, and with the bundled train.py (disttrain.torch.init():
    torch.distributed with the world mpirun started, not a world of one per process). The
    last as root (`--user 0`, what a root host user's `--user "$(id -u):$(id -g)"` gives),
    which Open MPI refuses unless the image allows it."""
    code = code_dir(tmp_path, train__py=(SEED / "horovod_snippet.py").read_text())
    for script in (["train.py"], ["/opt/disttrain/examples/train.py", "--steps", "40"]):
        for command in (["horovodrun", "-np", "2", "-H", "localhost:2", "python", *script],
                        ["mpirun", "-np", "2", "python", *script]):
            root = command[0] == "mpirun" and script[0] != "train.py"
            run = run_image(*command, code=code, user="0" if root else None)
            assert run.returncode == 0, command + [run.stdout[-2000:], run.stderr[-2000:]]
            assert_replicas_agree(run.stdout, 2)


ARGS_SCRIPT = "import sys\nprint('ARGS', sys.argv[1:], flush=True)\n"
ARGS_SHELL = "#!/bin/sh\necho \"ARGS $*\"\n"


def test_script_arguments_and_programs_are_told_apart(image, tmp_path):
    code = code_dir(tmp_path, train__py=ARGS_SCRIPT, show__sh=ARGS_SHELL)
    cases = [
        ((["--epochs", "3"], {}), "ARGS ['--epochs', '3']"),             # options: the script's
        ((["--", "test"], {}), "ARGS ['test']"),                        # -- forces a program's name through
        ((["train.py", "--epochs", "3"], {}), "ARGS ['--epochs', '3']"),  # the script's own name is dropped
        ((["--", "yes"], {"ENTRYPOINT": "/app/code/show.sh"}), "ARGS yes"),   # an ENTRYPOINT that is not .py
    ]
    for (args, env), expected in cases:
        run = run_image(*args, env=env, code=code)
        assert run.returncode == 0 and expected in run.stdout, (args, run.stdout[-1500:], run.stderr[-1500:])
    program = run_image("test", code=code)                        # a program on PATH wins, and says so
    assert program.returncode == 1 and "ARGS" not in program.stdout
    assert "put -- before it" in program.stderr, program.stderr
    # What the entrypoint adds for TensorFlow (the image's own environment already has
    # TF_USE_LEGACY_KERAS=1: test_image.py's one-Keras test).
    dry = run_image("--dry-run", "bash", env={"FRAMEWORK": "tensorflow"})
    assert dry.returncode == 0 and "runs:  bash" in dry.stdout and "TF_CPP_MIN_LOG_LEVEL=2" in dry.stdout


# --------------------------------------------------------------------------- no silent split

class SeedProject(ComposeProject):
    """The seed's own compose example (tests/e2e/seed/docker-compose.yml), plus overrides."""

    def __init__(self, *overrides: str, **env: str):
        super().__init__(**env)
        self.files = [SEED / "docker-compose.yml", *(SEED / o for o in overrides)]

    def compose(self, *args, timeout=600, check=False, **env):
        files = [arg for f in self.files for arg in ("-f", str(f))]
        return subprocess.run([*compose_command(), "-p", self.name, *files, *args],
                              env={**self.env, **{k: str(v) for k, v in env.items()}}, capture_output=True,
                              text=True, timeout=timeout, check=check)


def test_seed_horovod_snippet_under_the_seed_compose_stops_instead_of_training_apart(image, tmp_path):
    """Seed 000's compose file (no LAUNCHER: torchrun) with seed 001's Horovod snippet: every
    process would be a world of one. The job stops, naming LAUNCHER; with it set, it trains."""
    code = code_dir(tmp_path, train__py=(SEED / "horovod_snippet.py").read_text())
    data = tmp_path / "data"
    data.mkdir()
    split = SeedProject(CODE_PATH=str(code), DATA_PATH=str(data))
    try:
        run = split.compose("up", "--abort-on-container-exit", timeout=300)
        output = split.logs()
        codes = split.exit_codes()
        assert all(code != 0 for code in codes.values()) and len(codes) == 2, (codes, output[-3000:])
        assert "set LAUNCHER=horovod" in output and not results(output), output[-3000:]
    finally:
        split.down()
    fixed = SeedProject("launcher-horovod.yml", CODE_PATH=str(code), DATA_PATH=str(data))
    try:
        run = fixed.compose("up", "--abort-on-container-exit", timeout=300)
        assert run.returncode == 0 and set(fixed.exit_codes().values()) == {0}, fixed.logs()[-3000:]
        assert_replicas_agree(fixed.logs(), 2)
    finally:
        fixed.down()


DDP_SCRIPT = '''"""torch.distributed only (seed 000's integration note), nothing of Horovod. It ends
as docs/usage.md tells plain torch scripts to: torch 2.13 + Gloo can abort a finished rank in
the interpreter's teardown while DDP still holds the group (docs/testing.md)."""
import hashlib, os, sys
import torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn(1024, 16, generator=torch.Generator().manual_seed(1))
y = x @ torch.randn(16, 1, generator=torch.Generator().manual_seed(2))
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss = lambda: nn.functional.mse_loss(model(x), y).item()
before, rank, world = loss(), dist.get_rank(), dist.get_world_size()
for step in range(60):
    part = slice((step * world + rank) * 16 % 1024, (step * world + rank) * 16 % 1024 + 16)
    opt.zero_grad(); nn.functional.mse_loss(model(x[part]), y[part]).backward(); opt.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
print(f"RESULT framework=pytorch rank={rank} world={world} loss_before={before:.6f} loss_after={loss():.6f} "
      f"digest={digest}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
'''


def test_torch_distributed_script_under_launcher_horovod_joins_one_group(image, project, tmp_path):
    """LAUNCHER=horovod also gives env:// (MASTER_ADDR and a port of its own), so a plain
    torch.distributed script trains as one job across the two nodes instead of failing."""
    code = code_dir(tmp_path, train__py=DDP_SCRIPT)
    job = project(LAUNCHER="horovod", CODE_PATH=str(code))
    run = job.compose("up", "--abort-on-container-exit", timeout=300)
    assert run.returncode == 0 and set(job.exit_codes().values()) == {0}, job.logs()[-3000:]
    assert_replicas_agree(job.logs(), 2)


def test_compose_gradient_strategies_reach_a_plain_ddp_script_in_both_containers(image, project, tmp_path):
    """GRAD_COMPRESSION and GRAD_ACCUMULATION through compose, applied by the image's
    per-interpreter hook to a script that only uses torch's DDP: PowerSGD's hook in both
    running DDPs and low-rank gradients on the wire, and the first update equal to one step
    on the combined batch of both containers' micro-batches."""
    script = (ROOT / "tests/e2e/grad_sync_steps.py").read_text()
    job = project(CODE_PATH=str(code_dir(tmp_path, train__py=script)), TRAIN_ARGS="--steps 24",
                  GRAD_COMPRESSION="powersgd", GRAD_ACCUMULATION="2")
    run = job.compose("up", "--abort-on-container-exit", timeout=300)
    output = job.logs()
    assert run.returncode == 0 and set(job.exit_codes().values()) == {0}, output[-3000:]
    seen = {kind: [dict(re.findall(r"(\w+)=(\S+)", line)) for line in re.findall(rf"{kind} (rank=.*)", output)]
            for kind in ("HOOKS", "GRADS", "FIRST", "DONE")}
    assert [h["ddp_hooks"] for h in seen["HOOKS"]] == ["powerSGD_hook"] * 2, output[-3000:]
    last = [g for g in seen["GRADS"] if g["step"] == "23"]
    assert len(last) == 2 and all(int(g["weight_rank"]) <= 4 for g in last), last      # full rank: 24
    assert len(seen["FIRST"]) == 2 and all(float(f["max_diff"]) < 1e-6 for f in seen["FIRST"]), seen["FIRST"]
    assert len(seen["DONE"]) == 2 and len({d["digest"] for d in seen["DONE"]}) == 1, seen["DONE"]


def test_a_rank_stalled_in_one_container_is_named_and_both_containers_end_with_124(image, project, tmp_path):
    """Global rank 1 (the worker's) stops at step 15 while rank 0 waits in the allreduce: both
    containers dump their stacks, say the same line, and exit 124 within HANG_TIMEOUT + 10 s."""
    stall = ROOT / "bench" / "workloads" / "stall.py"
    code = code_dir(tmp_path, train__py=stall.read_text())
    line_no = next(i for i, line in enumerate(stall.read_text().splitlines(), 1) if "time.sleep(0.1)" in line)
    job = project(CODE_PATH=str(code), HANG_TIMEOUT="5")
    job.compose("up", "-d", check=True)
    deadline, shown = time.monotonic() + 240, ""
    while time.monotonic() < deadline and not re.search(r"^\s+1 \S+\s+[\d.]+\s+1 ", shown, re.M):
        shown = job.compose("exec", "-T", "master", "disttrain", "status").stdout   # the master's view
        time.sleep(0.5)
    assert re.search(r"^\s+0 master\s+[\d.]+\s+0 ", shown, re.M), shown
    job.wait_for_log("[rank1]: stack of rank 1", 60, service="worker")
    stacks_seen = time.monotonic()
    job.wait_exited(60)
    assert time.monotonic() - stacks_seen < 15
    assert set(job.exit_codes().values()) == {124}, (job.exit_codes(), job.logs()[-4000:])
    for name, log in job.logs_by_container().items():
        [line] = re.findall(r"entrypoint: stopping: (no progress for .*)", log)
        assert re.search(rf"rank 1 \(node 1 on \S+\) stalled after step 14: it is at "
                         rf"/app/code/train.py:{line_no} in wait_forever", line), (name, line)
        assert "rank 0 (node 0 on master) waits in backward (DDP's gradient allreduce)" in line, (name, line)
        assert "stacks: /app/checkpoints/diagnostics/hang-" in line
    worker = next(log for name, log in job.logs_by_container().items() if "worker" in name)
    assert f'[rank1]:   File "/app/code/train.py", line {line_no} in wait_forever' in worker


# A container profile that forbids attaching to a process (as stricter runtimes' do): Docker's
# default profile with ptrace and process_vm_readv refused.
NO_PTRACE = json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
    {"names": ["ptrace", "process_vm_readv"], "action": "SCMP_ACT_ERRNO"}]})


@pytest.mark.parametrize("ptrace", [True, False], ids=["ptrace-allowed", "ptrace-refused"])
def test_a_stalled_rank_s_native_frames_where_the_container_allows_ptrace(image, tmp_path, ptrace):
    """`docker run` with two processes, rank 1 stalls. Where the container lets py-spy attach
    (Docker's default profile here), the diagnostics file holds both ranks' native frames
    (rank 0 waits in DDP's reducer); where it does not, one line says so, and the Python
    stacks are there all the same."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    os.chmod(checkpoints, 0o777)                      # the image runs as uid 1000
    code = code_dir(tmp_path, train__py=(ROOT / "bench" / "workloads" / "stall.py").read_text())
    container = (DockerContainer(image).with_env("TRAIN_MODE", "local").with_env("NPROC_PER_NODE", "2")
                 .with_env("HANG_TIMEOUT", "5")
                 .with_volume_mapping(str(code), "/app/code", "ro")
                 .with_volume_mapping(str(checkpoints), "/app/checkpoints", "rw"))
    if not ptrace:
        container = container.with_kwargs(security_opt=[f"seccomp={NO_PTRACE}"])
    code, output = run_to_end(container, timeout=240)
    assert code == 124, output[-3000:]
    [saved] = checkpoints.glob("diagnostics/hang-*/node0.txt")
    text = saved.read_text()
    assert "in wait_forever" in text and "stack of rank 0" in text
    if ptrace:
        assert "native stacks (py-spy) of this node's ranks: in /app/checkpoints/diagnostics/hang-" in output
        assert "c10d::Reducer::finalize_backward" in text and "native stack of rank 1" in text, text[-3000:]
    else:
        assert re.search(r"entrypoint: no native stacks: .*SYS_PTRACE", output), output[-3000:]
        assert "native stack of" not in text


def test_a_container_slowed_with_docker_update_is_named_a_straggler(image, project, tmp_path):
    """`docker update --cpus 0.25` on the worker: its rank's own work per step grows, and
    the master names it once, with both figures."""
    stall = ROOT / "bench" / "workloads" / "stall.py"
    job = project(CODE_PATH=str(code_dir(tmp_path, train__py=stall.read_text())), STRAGGLER_WINDOW="5",
                  TRAIN_ARGS="--stall-step 0 --steps 1000000 --work 128 --step-sleep 0")
    job.compose("up", "-d", check=True)
    deadline, shown = time.monotonic() + 240, ""
    while time.monotonic() < deadline and len(re.findall(r"^\s+[01] \S+\s+[\d.]+\s+[01]\s+\d+\s+\d{3,}",
                                                        shown, re.M)) < 2:
        shown = job.compose("exec", "-T", "master", "disttrain", "status").stdout      # both past 100 steps
        time.sleep(0.5)
    [worker] = job.containers("worker")
    docker("update", "--cpus", "0.25", worker["ID"])
    job.wait_for_log("straggler: rank 1", 90, service="master")
    master = job.compose("logs", "--no-color", "master").stdout
    [line] = re.findall(r"entrypoint: straggler: (rank 1 .*)", master)
    assert re.match(r"rank 1 \(node 1 on \S+\) takes [\d.]+s its own work \(forward and data\) per step, "
                    r"[\d.]+x the others' median [\d.]+s, for \d+s", line), line
    assert "straggler: rank 0" not in master
    # The status, from the master: in `disttrain status`, and in its log on SIGUSR1 (tini -g passes it on).
    # It shows who is behind now: the throttled worker, whenever a step finds it so (on this
    # loaded host a moment can find both ranks as slow: CI once read "nobody").
    deadline = time.monotonic() + 30
    while "behind: rank 1 (node 1 on" not in (shown := job.compose("exec", "-T", "master", "disttrain",
                                                                     "status").stdout) and time.monotonic() < deadline:
        time.sleep(1)
    assert "behind: rank 1 (node 1 on" in shown, shown
    [master_container] = job.containers("master")
    docker("kill", "-s", "USR1", master_container["ID"])
    job.wait_for_log("entrypoint: job as node 0 (master) saw it", 20, service="master")


# --------------------------------------------------------------------------- Docker Swarm

def docker_clients() -> list[str]:
    """The docker clients here: the first on PATH and Debian's (20.10 refused a stack file
    without `version:`). On a machine with one, one."""
    found = {}
    for path in (shutil.which("docker"), "/usr/bin/docker"):
        if path and os.path.exists(path):
            version = subprocess.run([path, "version", "--format", "{{.Client.Version}}"], capture_output=True,
                                     text=True).stdout.strip()
            found.setdefault(os.path.realpath(path), (path, version))
    return [found[k] for k in sorted(found)]


@pytest.fixture(scope="module")
def swarm(image):
    with Swarm() as s:
        yield s


@pytest.mark.parametrize("client, version", docker_clients(), ids=[v for _, v in docker_clients()])
def test_swarm_stack_trains_two_nodes_over_the_overlay_network(image, swarm, client, version, tmp_path):
    data, checkpoints = tmp_path / "data", tmp_path / "checkpoints"
    data.mkdir()
    checkpoints.mkdir()
    checkpoints.chmod(0o777)
    secret = tmp_path / "job_secret"            # a Swarm secret, made by `stack deploy` from this file
    secret.write_text(uuid.uuid4().hex)
    stack = SwarmStack(client, CODE_PATH=str(ROOT / "examples"), DATA_PATH=str(data),
                       CHECKPOINT_PATH=str(checkpoints), RDZV_TIMEOUT="120", JOB_SECRET_PATH=str(secret))
    try:
        deployed = stack.deploy()
        assert deployed.returncode == 0, f"{client} ({version}): {deployed.stderr}"
        tasks = stack.wait_finished(expected=2, timeout=300)
        output = stack.logs()
        assert all(state.startswith("Complete") for _, state in tasks), (tasks, output[-3000:])
        assert_replicas_agree(output, 2)
        assert "(TLS, JOB_SECRET)" in output and "WARNING: no JOB_SECRET" not in output
    finally:
        stack.remove()


# --------------------------------------------------------------------------- elastic (MIN_NODES:MAX_NODES)

ELASTIC = dict(MIN_NODES=1, MAX_NODES=3, MAX_RESTARTS=3,
               TRAIN_ARGS="--steps 300 --step-delay 0.05 --checkpoint-every 1000")


@pytest.mark.parametrize("launcher", ["native", "horovod", "keras-horovod"])
def test_elastic_job_goes_on_after_docker_kill_of_a_worker(image, project, launcher):
    horovod = {"LAUNCHER": "horovod", "MAX_RESTARTS": 0, **({"FRAMEWORK": "keras"} if launcher == "keras-horovod" else {})}
    job = project(**{**ELASTIC, **(horovod if launcher != "native" else {"LAUNCHER": "native"})})
    job.compose("up", "-d", check=True)
    job.wait_for_log("step 40 loss", 240)        # global rank 0 prints it, on whichever node torchrun put it
    # Both nodes train (Horovod's driver may start with the master alone: MIN_NODES=1, and the
    # worker, gated by the master's healthcheck, joins a few seconds later).
    job.wait_for_log(" world 2", 120)
    job.compose("kill", "worker", check=True)                    # SIGKILL: the container is gone
    job.wait_exited(240)
    codes, logs = job.exit_codes(), job.logs_by_container()
    master = next(name for name in codes if "master" in name)
    assert codes[master] == 0, f"{codes}\n{logs[master][-5000:]}"
    assert changes(logs[master]), "\n".join(f"== {name}\n{text[-3000:]}" for name, text in logs.items())
    (old, new, step) = changes(logs[master])[-1]
    assert (old, new) == (2, 1) and step >= (40 if launcher == "native" else 30)
    found = results(logs[master])
    assert len(found) == 1, logs[master][-4000:]
    [result] = found
    assert result.world == 1 and result.after < initial_loss("\n".join(logs.values()))
    assert launcher != "native" or f"resumed_from={step}" in result.extra       # Horovod: its last commit
    # Horovod's driver learns it from the master's link to the worker, not PEER_TIMEOUT later
    assert launcher == "native" or "node 1 lost: its connection closed" in logs[master], logs[master][-3000:]
    # torchrun's: the round re-formed when the connection closed; nothing is stale, nothing restarted
    assert "was lost without a connection reset" not in logs[master], logs[master][-3000:]


def test_elastic_job_grows_with_compose_scale(image, project):
    job = project(**ELASTIC)
    job.compose("up", "-d", check=True)
    job.wait_for_log("step 40 loss", 240)
    job.compose("up", "-d", "--scale", "worker=2", "--no-recreate", check=True)
    job.wait_exited(300)
    codes, logs = job.exit_codes(), job.logs_by_container()
    assert list(codes.values()) == [0, 0, 0], (codes, job.logs()[-4000:])
    master = next(name for name in codes if "master" in name)
    [(old, new, step)] = changes(logs[master])
    assert (old, new) == (2, 3) and step >= 40
    found = results("\n".join(logs.values()))
    assert sorted(r.rank for r in found) == [0, 1, 2] and len({r.digest for r in found}) == 1
    assert all(f"resumed_from={step}" in r.extra and r.after < initial_loss("\n".join(logs.values())) for r in found)


def test_losing_the_master_container_stops_every_worker(image, project):
    peer_timeout, grace = 6, 8                # GRACE_PERIOD: the image's default
    job = project(**{**ELASTIC, "PEER_TIMEOUT": peer_timeout, "TRAIN_ARGS": "--steps 100000 --step-delay 0.05"})
    job.compose("up", "-d", "--scale", "worker=2", check=True)
    job.wait_for_log("step 40 loss", 240)
    killed = time.monotonic()
    job.compose("kill", "master", check=True)
    job.wait_exited(60)
    elapsed = time.monotonic() - killed
    codes, logs = job.exit_codes(), job.logs_by_container()
    workers = sorted(name for name in codes if "worker" in name)
    assert len(workers) == 2 and all(codes[w] == 1 for w in workers), (codes, job.logs()[-3000:])
    for w in workers:
        lines = [line for line in logs[w].splitlines() if re.search(r"lost the master at master:\d+", line)]
        assert len(lines) == 1, logs[w][-3000:]
    assert elapsed < peer_timeout + grace + 5, elapsed          # + polling and `compose ps`
def test_a_job_on_etcd_survives_one_member_and_docker_kill_of_the_node_with_global_rank_0(image, project):
    """compose/etcd.yml: three etcd members (Debian's etcd in place of the upstream image),
    three nodes, none a master. One member is killed mid-job (nothing happens), then the
    container running global rank 0: the other two go on from the step it reached."""
    from tests.e2e.docker_env import etcd_image

    job = project(base="etcd.yml", ETCD_IMAGE=etcd_image(), PEER_TIMEOUT=5,
                  TRAIN_ARGS="--steps 300 --step-delay 0.05 --checkpoint-every 1000")
    job.compose("up", "-d", check=True)
    job.wait_for_log("step 20 loss", 240, "node")
    job.compose("kill", "etcd1", check=True)
    job.wait_for_log("step 60 loss", 120, "node")
    logs = job.logs_by_container()
    [first] = [name for name, text in logs.items() if "step 60 loss" in text]
    docker("kill", first)
    deadline = time.monotonic() + 240
    while any(row["State"] != "exited" for row in job.containers("node")) and time.monotonic() < deadline:
        time.sleep(1)
    codes, logs = job.exit_codes(), job.logs_by_container()
    survivors = [name for name in codes if "-node-" in name and name != first]
    assert [codes[name] for name in survivors] == [0, 0], (codes, job.logs()[-4000:])
    output = "\n".join(logs[name] for name in survivors)
    assert len(re.findall(r"rendezvous: 3 node\(s\)", output)) == 2          # one round until the kill
    assert len(re.findall(r"rendezvous: 2 node\(s\).*a node left or was lost", output)) == 2
    [resumed] = re.findall(r"ELASTIC first step at world size 2 \(resumed from step (\d+)\)", output)
    assert int(resumed) >= 60
    assert sorted(r.rank for r in results(output)) == [0, 1]


def test_compose_restart_resumes_tensorflow_from_its_backup_after_a_worker_dies(image, project):
    """compose/restart.yml: every process of the worker's container dies mid-training (as
    in a crash or an OOM kill; `docker kill` would count as a deliberate stop). Docker
    restarts the worker, the master's processes fail and it restarts too, and the job
    continues from the last Keras backup to exit 0 on both, with a lower loss."""
    job = project("restart.yml", FRAMEWORK="tensorflow",
                  TRAIN_ARGS="--steps 200 --step-delay 0.05 --checkpoint-every 20")
    job.compose("up", "-d", check=True)
    job.wait_for_log("step 60 ", 240, service="master")
    [worker] = job.containers("worker")
    killed = time.monotonic()
    docker("exec", "-u", "0", worker["ID"], "sh", "-c", "kill -9 -1", check=False)    # every process but PID 1
    job.wait_for_log("RESUMED rank=0", 240, service="master")
    print(f"kill -> training resumed from the backup: {time.monotonic() - killed:.1f} s")
    job.wait_exited(300)
    codes, restarts, output = job.exit_codes(), job.restart_counts(), job.logs()
    assert set(codes.values()) == {0}, (codes, restarts, output[-4000:])
    assert all(count >= 1 for count in restarts.values()), restarts          # the master came back too
    resumed = {int(rank): int(step) for rank, step in re.findall(r"RESUMED rank=(\d+) step=(\d+)", output)}
    assert sorted(resumed) == [0, 1] and len(set(resumed.values())) == 1, output[-4000:]
    assert 60 <= resumed[0] < 200, resumed                                   # the last backup, not step 0
    assert_replicas_agree(output, 2)


def test_compose_checkpoints_to_a_bucket_and_fresh_containers_resume_from_it(image, project):
    """compose/s3.yml: no volume shared by the nodes, checkpoints in a bucket on an
    S3-compatible server beside the job. The containers are removed after the first run;
    fresh ones, with empty caches, resume from the bucket's newest checkpoint."""
    from tests.e2e.docker_env import seaweed_image

    job = project("s3.yml", S3_IMAGE=seaweed_image(), TRAIN_ARGS="--steps 40")
    run = job.compose("up", "--abort-on-container-exit", "--exit-code-from", "master", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    first = job.logs()
    assert "everything finished is in the bucket" in first, first[-3000:]
    job.compose("rm", "-f", "-s", "master", "worker", check=True)             # fresh containers next
    again = job.compose("up", "--abort-on-container-exit", "--exit-code-from", "master", timeout=600,
                        TRAIN_ARGS="--steps 60")
    assert again.returncode == 0, again.stdout[-3000:]
    output = job.logs()
    assert output.count("checkpoints: resuming from s3://train/checkpoints/") == 2, output[-3000:]
    assert [line for line in output.splitlines() if "RESUMED" in line and "step=40" in line], output[-3000:]
    second = results(output)[-2:]
    assert len({r.digest for r in second}) == 1
