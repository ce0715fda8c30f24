"""A CUDA image on a host without a GPU (this machine): Horovod's collectives run on CPU
tensors, and PyTorch's `hvd.join(device)` with a GPU's device id, as Horovod's own
test_torch.py calls it, joins on the CPU in every rank (patch 0007) instead of failing in
one rank (`Could not dlopen libcuda.so`) while the others wait in their next collective.

Needs a CUDA variant's image (the `cuda_image` fixture: CUDA_TEST_IMAGE, else the newest
built here); skipped without one, as in CI, which builds none.
"""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest

from tests.e2e.docker_env import docker

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

# Rank 0 joins first with its local rank as the device; rank 1 all-reduces while rank 0 has
# joined (Horovod counts a joined rank's tensor as zeros), then joins: both see rank 1 last.
JOIN = """
import horovod.torch as hvd, torch
hvd.init()
assert not torch.cuda.is_available()
if hvd.rank() == 1:
    total = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="while_rank0_joined")
    assert total.tolist() == [1.0] * 4, total
last = hvd.join(hvd.local_rank())
done = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="after_join")
print(f"JOINED rank={hvd.rank()} last={last} sum={done.item():g} cuda_built={hvd.cuda_built()}", flush=True)
"""


def test_horovod_join_with_a_gpu_device_joins_on_the_cpu_in_every_rank(cuda_image, tmp_path):
    (tmp_path / "join.py").write_text(JOIN)
    tmp_path.chmod(0o755)                      # the image's user (1000) reads it
    name = f"dtf-cuda-join-{uuid.uuid4().hex[:8]}"
    try:
        # A rank left waiting would never end: the timeout fails the test, `finally` removes it.
        run = subprocess.run(["docker", "run", "--rm", "--name", name, "-v", f"{tmp_path}:/app/code:ro", cuda_image,
                              "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "python", "join.py"],
                             capture_output=True, text=True, timeout=180)
    finally:
        docker("rm", "-f", name, check=False)
    lines = re.findall(r"JOINED rank=(\d) last=(\d) sum=(\S+) cuda_built=(\w+)", run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(lines) == [("0", "1", "3", "True"), ("1", "1", "3", "True")], run.stdout[-3000:]
