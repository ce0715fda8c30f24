"""The folders a node's processes write to, checked or redirected before anything starts.

HPC runtimes and OpenShift run an image read-only and as the calling user or an arbitrary
uid (Apptainer, Charliecloud, enroot, `docker run --read-only --user`). What the training
processes write would then fail late, at the first checkpoint or the first cache write:

* CHECKPOINT_DIR (checkpoints, Keras backups, hang diagnostics) must be writable: if not,
  one line naming it and what to mount, exit 2.
* A temporary folder (Python's tempfile, torchrun's log folders): without one, a private
  TMPDIR in /dev/shm (a tmpfs even in a read-only container).
* The frameworks' caches: each variable below, when set, must name a writable folder; when
  HOME cannot be written (uid 12345 gets HOME=/), the processes get a private HOME in the
  temporary folder, so that ~/.keras, ~/.cache (torch, Triton, pip), ~/.config/matplotlib
  and ~/.nv (CUDA's kernel cache) land somewhere writable. Said in one line.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable

from ..contract.config import ConfigError

# A cache's variable -> what writes there.
CACHE_VARIABLES = {
    "XDG_CACHE_HOME": "torch hub and inductor, Triton, pip",
    "TORCH_HOME": "torch hub",
    "TRITON_CACHE_DIR": "Triton's compiled kernels",
    "TORCHINDUCTOR_CACHE_DIR": "torch.compile's kernels",
    "KERAS_HOME": "Keras' datasets and config",
    "MPLCONFIGDIR": "Matplotlib's config and font cache",
    "CUDA_CACHE_PATH": "CUDA's JIT-compiled kernels",
    "HF_HOME": "Hugging Face's downloads",
}


def can_write(folder: str) -> str | None:
    """None if a file can be made in `folder` (made if missing), else why not."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".disttrain-write-check-"):
            pass
        return None
    except OSError as exc:
        return exc.strerror or str(exc)


def owned_by_root(path: str) -> bool:
    try:
        return os.stat(path).st_uid == 0 and os.getuid() != 0
    except OSError:
        return False


def check_checkpoint_dir(path: str, why_not: Callable[[str], str | None] = can_write) -> None:
    if (reason := why_not(path)) is not None:
        if owned_by_root(path):             # docker run -v on a missing host folder made it so
            reason += ('; the folder belongs to root: Docker makes a missing host folder so; create it first '
                       '(mkdir -p) and run with --user "$(id -u):$(id -g)"')
        raise ConfigError(f"CHECKPOINT_DIR={path!r}: not writable by uid {os.getuid()} ({reason}); "
                          f"mount a writable folder there (-v HOST_DIR:{path}, a volume) or set CHECKPOINT_DIR "
                          f"to one")


def check_caches(env: dict[str, str], why_not: Callable[[str], str | None] = can_write) -> None:
    """Every cache variable the user set names a folder this uid can write."""
    for name, what in CACHE_VARIABLES.items():
        if env.get(name) and (reason := why_not(env[name])) is not None:
            raise ConfigError(f"{name}={env[name]!r} ({what}): not writable by uid {os.getuid()} ({reason}); "
                              f"mount a writable folder there or unset {name}")


def temp_dir() -> str | None:
    """A private temporary folder in /dev/shm when the usual one cannot be written; None
    when it can."""
    try:
        tempfile.gettempdir()
        return None
    except FileNotFoundError:
        tempfile.tempdir = None
    try:
        return tempfile.mkdtemp(prefix="disttrain-tmp-", dir="/dev/shm")
    except OSError as exc:
        raise ConfigError(f"TMPDIR: no writable temporary folder (/tmp, /dev/shm: {exc.strerror or exc}); "
                          f"mount a tmpfs (--tmpfs /tmp) or set TMPDIR to a writable folder") from None


def home_dir(env: dict[str, str], why_not: Callable[[str], str | None] = can_write) -> str | None:
    """A private HOME in the temporary folder when HOME is unset or cannot be written;
    None when it can."""
    home = env.get("HOME")
    if home and os.path.isdir(home) and why_not(home) is None:
        return None
    return tempfile.mkdtemp(prefix=f"disttrain-home-{os.getuid()}-")


def object_cache(env: dict[str, str], cache_dir: str, why_not: Callable[[str], str | None] = can_write) -> str | None:
    """CACHE_DIR for the copies of s3:// data and checkpoints: None when it can be written;
    when the default cannot (a read-only container), a folder in the temporary one; a
    CACHE_DIR the user set must be writable."""
    if (reason := why_not(cache_dir)) is None:
        return None
    if env.get("CACHE_DIR", "").strip():
        raise ConfigError(f"CACHE_DIR={env['CACHE_DIR']!r}: not writable by uid {os.getuid()} ({reason}); mount a "
                          f"writable volume there (the node-local copies of DATA_DIR and CHECKPOINT_DIR)")
    if (tmp := temp_dir()) is not None:
        os.environ["TMPDIR"] = env["TMPDIR"] = tempfile.tempdir = tmp
    return os.path.join(tempfile.gettempdir(), f"disttrain-cache-{os.getuid()}")


def prepare(env: dict[str, str], checkpoint_dir: str) -> list[str]:
    """Check and redirect, in `env` and this process's environment; the lines to say."""
    check_checkpoint_dir(checkpoint_dir)
    check_caches(env)
    said = []
    if (tmp := temp_dir()) is not None:
        os.environ["TMPDIR"] = env["TMPDIR"] = tmp
        said.append(f"no writable temporary folder (a read-only image?): TMPDIR={tmp}")
    if (home := home_dir(env)) is not None:
        was = f"HOME={env['HOME']!r} is not writable by uid {os.getuid()}" if env.get("HOME") else "HOME is not set"
        said.append(f"{was}: HOME={home} for the frameworks' caches (Keras, Matplotlib, torch, Triton); mount a "
                    f"folder and set HOME to keep them")
        os.environ["HOME"] = env["HOME"] = home
    return said
