"""A training script that looks for the job's secret where a training process could read
it: its own environment, its own /proc environ, and those of its ancestors that are this
image's entrypoint (and PID 1's). It is told what to look for reversed (PROBE_REVERSED),
so its own environment does not hold it. It prints `PROBE rank=R found=<places>` and
exits 0; the test reads the places."""

import os

needle = os.environ["PROBE_REVERSED"][::-1].encode()
rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
if os.environ.get("DMLC_ROLE") == "worker":       # MXNet's scheduler waits until every worker has registered
    import mxnet

    rank = str(mxnet.kv.create("dist_sync").rank)
found = []
if any(needle in value.encode() for value in os.environ.values()) or "JOB_SECRET" in os.environ:
    found.append("os.environ")


def proc(pid, name: str) -> bytes:
    """/proc/<pid>/<name>, or nothing where it cannot be read."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def parent(pid) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


if needle in proc("self", "environ"):
    found.append("/proc/self/environ")
pid = parent(os.getpid())
while pid > 1:
    argv = proc(pid, "cmdline").split(b"\0")
    ours = b"python" in os.path.basename(argv[0]) and b"entrypoint.main" in argv     # not an mpirun that runs one
    if ours and needle in proc(pid, "environ"):
        found.append(f"/proc/{pid}/environ (the entrypoint)")
    pid = parent(pid)
if needle in proc(1, "environ"):
    found.append("/proc/1/environ")
print(f"PROBE rank={rank} found={','.join(found) or 'nothing'}", flush=True)
