"""What a read-only image run as another uid may write: checked, or redirected, before
anything starts (entrypoint/machine/writable_dirs.py)."""

import os

import pytest

from entrypoint.machine import writable_dirs
from entrypoint.contract.config import ConfigError


def read_only(*folders: str):
    """A why_not that refuses `folders` (and what is under them), as a read-only mount does."""
    def why_not(folder: str) -> str | None:
        return "Read-only file system" if any(folder.startswith(f) for f in folders) else None
    return why_not


def test_a_cache_variable_naming_a_folder_that_cannot_be_written_is_one_line_naming_it():
    env = {"KERAS_HOME": "/opt/keras", "MPLCONFIGDIR": "/tmp/mpl"}
    with pytest.raises(ConfigError) as err:
        writable_dirs.check_caches(env, read_only("/opt"))
    line = str(err.value)
    assert line.startswith("KERAS_HOME='/opt/keras' (Keras' datasets and config): not writable by uid ")
    assert "(Read-only file system); mount a writable folder there or unset KERAS_HOME" in line
    writable_dirs.check_caches(env, read_only("/nowhere"))             # both writable: nothing said
    writable_dirs.check_caches({}, read_only("/"))                      # none set: nothing to check


def test_checkpoint_dir_that_cannot_be_written_names_the_mount():
    with pytest.raises(ConfigError, match=r"^CHECKPOINT_DIR='/app/checkpoints': not writable by uid \d+ "
                                          r"\(Read-only file system\); mount a writable folder there"):
        writable_dirs.check_checkpoint_dir("/app/checkpoints", read_only("/app"))


def test_home_is_redirected_only_when_it_cannot_be_written(tmp_path, monkeypatch):
    monkeypatch.setattr(writable_dirs.tempfile, "tempdir", str(tmp_path))
    assert writable_dirs.home_dir({"HOME": str(tmp_path)}) is None
    redirected = writable_dirs.home_dir({"HOME": "/"}, read_only("/"))
    assert redirected.startswith(str(tmp_path / f"disttrain-home-{os.getuid()}-")) and os.path.isdir(redirected)
    assert writable_dirs.home_dir({}, read_only("/nowhere")) is not None          # unset


def test_prepare_says_what_it_redirected_and_changes_the_processes_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(writable_dirs.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("HOME", "/proc")                                  # exists, not writable
    env = {"HOME": "/proc"}
    said = writable_dirs.prepare(env, str(tmp_path / "checkpoints"))
    assert len(said) == 1 and said[0].startswith(f"HOME='/proc' is not writable by uid {os.getuid()}: HOME=")
    assert env["HOME"] == os.environ["HOME"] != "/proc" and os.path.isdir(env["HOME"])
    assert (tmp_path / "checkpoints").is_dir()
