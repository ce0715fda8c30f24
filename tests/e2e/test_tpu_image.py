"""The tpu image on XLA's CPU client (PJRT_DEVICE=CPU): real PyTorch/XLA training through
the entrypoint, the one-line refusals, and the fact behind the one-process limit.

No TPU is used or needed. These tests need the tpu image (TPU_TEST_IMAGE, default
distributed-training-framework:tpu; `python build.py build tpu`, ~8 GB), which CI's test
job does not build: without it they skip, saying so.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import ROOT
from testing.results import results
from tests.e2e.docker_env import docker

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

def run(image: str, *args: str, env: dict | None = None, volumes: tuple = (), timeout: float = 600):
    flags = [f for k, v in (env or {}).items() for f in ("-e", f"{k}={v}")]
    flags += [f for v in volumes for f in ("-v", v)]
    return docker("run", "--rm", "--shm-size=1g", *flags, image, *args, check=False, timeout=timeout)


def test_xla_training_through_the_entrypoint_learns_and_resumes(tpu_image, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    os.chmod(checkpoints, 0o777)                      # the image runs as uid 1000
    mounts = (f"{ROOT / 'examples'}:/app/code:ro", f"{checkpoints}:/app/checkpoints")
    first = run(tpu_image, "--steps", "40", env={"PJRT_DEVICE": "CPU"}, volumes=mounts)
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-4000:]
    assert "preflight: accelerator cpu, PJRT_DEVICE=CPU" in output
    assert "one PyTorch/XLA process per host, PJRT_DEVICE=CPU" in output
    [result] = results(output)
    assert "device=xla:0" in result.extra and "xla=True" in result.extra
    assert result.after < 0.5 * result.before, result
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-00000020.pt", "ckpt-00000040.pt"]

    again = run(tpu_image, "--steps", "50", env={"PJRT_DEVICE": "CPU"}, volumes=mounts)
    output = again.stdout + again.stderr
    assert again.returncode == 0 and "RESUMED rank=0 step=40" in output, output[-4000:]
    [resumed] = results(output)
    assert abs(resumed.before - result.after) < 1e-6        # picked up the parameters it left


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATOR": "tpu"}, "ACCELERATOR='tpu': no TPU on this host"),
    ({"PJRT_DEVICE": "CPU", "NPROC_PER_NODE": "2"}, "PJRT_DEVICE='CPU': XLA's CPU client serves one process"),
    ({"PJRT_DEVICE": "TPU"}, "PJRT_DEVICE='TPU': no usable TPU here"),
])
def test_what_this_host_cannot_run_is_one_line_and_exit_2(tpu_image, env, message):
    done = run(tpu_image, env=env, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip().splitlines() == [f"entrypoint: {done.stderr.strip().removeprefix('entrypoint: ')}"]
    assert message in done.stderr


PROBE = r"""
import torch, torch.distributed as dist, torch_xla, torch_xla.distributed.xla_backend
dist.init_process_group("xla", init_method="xla://")
t = torch.ones(1, device=torch_xla.device()) * (int(__import__("os").environ["RANK"]) + 1)
dist.all_reduce(t)
__import__("sys").stdout.write(f"PROBE rank={__import__('os').environ['RANK']} xla_world={dist.get_world_size()} sum={t.item()}\n")
"""


def test_xla_cpu_client_cannot_span_two_processes(tpu_image):
    """Why PJRT_DEVICE=CPU is refused for more than one process: under torchrun each process
    gets its own one-device CPU client, so xla:// gives world 1 and allreduce sums nothing.
    If a torch-xla release lifts this, this test fails and the refusal can go."""
    done = docker("run", "--rm", "--entrypoint", "sh", "-e", "PJRT_DEVICE=CPU", tpu_image, "-c",
                  f"cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF\ntorchrun --standalone --nproc-per-node=2 /tmp/probe.py",
                  check=False, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    # Two processes share one pipe: a line may arrive glued to the other's, so match, don't split.
    probes = sorted(re.findall(r"PROBE rank=\d+ xla_world=\d+ sum=[0-9.]+", output))
    assert probes == ["PROBE rank=0 xla_world=1 sum=1.0", "PROBE rank=1 xla_world=1 sum=2.0"], output[-3000:]


# What the entrypoint gives PyTorch/XLA's processes across TPU hosts behind JOB_SECRET
# (processes.job_store_env): MASTER_ADDR:MASTER_PORT is the node's tunnel to the job store and
# TORCHELASTIC_USE_AGENT_STORE=True. Here a TCPStore on loopback stands in for the tunnel.
AGENT_STORE_PROBE = r"""
import os, subprocess, sys
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
before = server.num_keys()
child = '''
import psutil, torch, torch.distributed as dist, torch_xla, torch_xla.distributed.xla_backend
dist.init_process_group("xla", init_method="xla://")
t = torch.ones(1, device=torch_xla.device())
dist.all_reduce(t)
open_ports = [c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
              if c.status == psutil.CONN_LISTEN and c.laddr.ip in ("0.0.0.0", "::")]
print(f"XLA_GROUP world={dist.get_world_size()} sum={t.item()} open={open_ports}", flush=True)
'''
env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port), TORCHELASTIC_USE_AGENT_STORE="True")
done = subprocess.run([sys.executable, "-c", child], env=env)
print(f"STORE keys_written={server.num_keys() - before} exit={done.returncode}", flush=True)
"""


def test_xla_store_under_a_secret_is_a_client_of_the_store_it_is_given(tpu_image):
    """torch_xla's xla:// handler (2.9) with TORCHELASTIC_USE_AGENT_STORE=True: its process 0
    serves no store on every interface; the group's keys go to the store at MASTER_ADDR:
    MASTER_PORT, which behind JOB_SECRET is the job store through the node's tunnel."""
    done = run(tpu_image, "python", "-c", AGENT_STORE_PROBE, env={"PJRT_DEVICE": "CPU"}, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "XLA_GROUP world=1 sum=1.0 open=[]" in output, output[-3000:]
    written = re.search(r"STORE keys_written=(\d+) exit=0", output)
    assert written and int(written.group(1)) > 0, output[-3000:]


def test_no_xla_process_reads_the_secret(tpu_image, tmp_path):
    """The environ probe of test_secret_host.py, in the tpu image's XLA process (one host on
    XLA's CPU client: no TPU here for more). Given as JOB_SECRET_FILE, the secret is in no
    environment the process can read; given as `-e JOB_SECRET`, only in PID 1's (tini's),
    which the entrypoint cannot blank and says so."""
    secret = "5d8e2b7a9c1f4e6a3b0d8c7e2f9a1b4d"
    secret_file = tmp_path / "job_secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o644)                          # the image runs as uid 1000
    probe = dict(PJRT_DEVICE="CPU", ENTRYPOINT="/app/code/secret_probe.py", PROBE_REVERSED=secret[::-1])
    code = f"{ROOT / 'tests' / 'e2e'}:/app/code:ro"

    mounted = run(tpu_image, env={**probe, "JOB_SECRET_FILE": "/run/secrets/job_secret"},
                  volumes=(code, f"{secret_file}:/run/secrets/job_secret:ro"), timeout=300)
    output = mounted.stdout + mounted.stderr
    assert mounted.returncode == 0, output[-3000:]
    assert "one PyTorch/XLA process per host" in output, output[-3000:]
    assert re.findall(r"PROBE rank=\S+ found=(\S+)", output) == ["nothing"], output[-3000:]

    given = run(tpu_image, env={**probe, "JOB_SECRET": secret}, volumes=(code,), timeout=300)
    output = given.stdout + given.stderr
    assert given.returncode == 0, output[-3000:]
    assert re.findall(r"PROBE rank=\S+ found=(\S+)", output) == ["/proc/1/environ"], output[-3000:]
    assert "WARNING: JOB_SECRET stays readable in /proc/1/environ" in output and secret not in output
