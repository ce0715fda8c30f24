"""The in-process guard against a silent split (disttrain/guard.py): its decisions are pure;
the hook itself is exercised on a stand-in module here and for real in the image."""

import subprocess
import sys
import textwrap

from disttrain.guard import horovod_split, mwms_split


def test_horovod_world_of_one_under_torchrun_names_the_variable():
    line = horovod_split(1, {"WORLD_SIZE": "2", "DISTTRAIN_LAUNCHER": "native", "FRAMEWORK": "pytorch"})
    assert "LAUNCHER=horovod" in line and "torchrun" in line and "WORLD_SIZE=2" in line and "\n" not in line


def test_horovod_by_hand_under_another_launcher():
    line = horovod_split(1, {"WORLD_SIZE": "4"})
    assert "horovodrun" in line and "WORLD_SIZE=4" in line


def test_horovod_that_joined_is_left_alone():
    assert horovod_split(2, {"WORLD_SIZE": "2", "DISTTRAIN_LAUNCHER": "horovod"}) is None
    assert horovod_split(1, {}) is None                                   # a single process
    assert horovod_split(1, {"WORLD_SIZE": "1"}) is None
    assert horovod_split(1, {"WORLD_SIZE": "x"}) is None


def test_an_elastic_horovod_world_may_shrink():
    assert horovod_split(1, {"WORLD_SIZE": "2", "HOROVOD_ELASTIC": "1"}) is None


def test_mwms_without_tf_config_under_horovod():
    line = mwms_split({"WORLD_SIZE": "2", "DISTTRAIN_LAUNCHER": "horovod"}, has_resolver=False)
    assert "LAUNCHER=native" in line and "TF_CONFIG" in line
    assert mwms_split({"WORLD_SIZE": "2", "TF_CONFIG": "{}"}, False) is None
    assert mwms_split({"WORLD_SIZE": "2"}, has_resolver=True) is None
    assert mwms_split({}, False) is None


def test_hook_patches_the_watched_module_when_it_is_imported(tmp_path):
    """A stand-in `horovod.common.basics` on sys.path: importing it through the hook makes
    init() stop the process with exit 2 and the one line."""
    pkg = tmp_path / "horovod" / "common"
    pkg.mkdir(parents=True)
    (tmp_path / "horovod" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "basics.py").write_text(textwrap.dedent("""
        class HorovodBasics:
            def init(self):
                return "initialised"
            def size(self):
                return 1
    """))
    code = ("import disttrain.guard as g; g.install(); from horovod.common.basics import HorovodBasics; "
            "print(HorovodBasics().init())")
    env = {"PYTHONPATH": f"{tmp_path}:{__import__('tests.conftest').conftest.ROOT}", "PATH": "/usr/bin:/bin"}
    split = subprocess.run([sys.executable, "-c", code], env={**env, "WORLD_SIZE": "2", "DISTTRAIN_LAUNCHER": "native"},
                           capture_output=True, text=True)
    assert split.returncode == 2 and "LAUNCHER=horovod" in split.stderr and split.stdout == ""
    fine = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert fine.returncode == 0 and fine.stdout.strip() == "initialised"
    off = subprocess.run([sys.executable, "-c", code], env={**env, "WORLD_SIZE": "2", "DISTTRAIN_GUARD": "0"},
                         capture_output=True, text=True)
    assert off.returncode == 0


def test_horovod_world_of_one_under_mxnet_parameter_servers():
    line = horovod_split(1, {"WORLD_SIZE": "2", "DISTTRAIN_LAUNCHER": "native", "FRAMEWORK": "mxnet"})
    assert "MXNet's parameter-server workers" in line and line.endswith("set LAUNCHER=horovod for a Horovod script")
