"""The arguments after the image name: a command or the training script's arguments. The
rule is pure (arguments.py); PATH and the file system are given as functions here."""

import pytest

from entrypoint.contract.arguments import parse_arguments

ON_PATH = {"bash": "/usr/bin/bash", "python": "/opt/venv/bin/python", "horovodrun": "/opt/venv/bin/horovodrun",
           "mpirun": "/usr/bin/mpirun", "test": "/usr/bin/test", "yes": "/usr/bin/yes"}
EXECUTABLE = {"/app/code/run.sh", "/app/code/tools/prep.sh"}
SCRIPT = "/app/code/train.py"


def parse(*args, script=SCRIPT, cwd="/app/code"):
    return parse_arguments(list(args), script, cwd, which=ON_PATH.get, executable=EXECUTABLE.__contains__)


CASES = [
    # (arguments, command or None, script arguments)
    ((), None, ()),
    (("--epochs", "10"), None, ("--epochs", "10")),
    (("-v",), None, ("-v",)),
    (("bash",), ("bash",), ()),
    (("python", "-c", "print(1)"), ("python", "-c", "print(1)"), ()),
    (("python", "train.py", "--epochs", "2"), ("python", "train.py", "--epochs", "2"), ()),
    (("horovodrun", "-np", "2", "-H", "localhost:2", "python", "train.py"),
     ("horovodrun", "-np", "2", "-H", "localhost:2", "python", "train.py"), ()),
    (("mpirun", "-np", "2", "python", "x.py"), ("mpirun", "-np", "2", "python", "x.py"), ()),
    (("test",), ("test",), ()),                                 # a program wins...
    (("--", "test"), None, ("test",)),                         # ...unless `--` says otherwise
    (("--", "--epochs", "3"), None, ("--epochs", "3")),
    (("train.py", "--epochs", "3"), None, ("--epochs", "3")),   # the script's own name
    (("./train.py", "--epochs", "3"), None, ("--epochs", "3")),
    (("/app/code/train.py",), None, ()),
    (("./tools/prep.sh", "x"), ("./tools/prep.sh", "x"), ()),  # a path to an executable file
    (("./notes.txt",), None, ("./notes.txt",)),                # a path to anything else: the script's
    (("evaluate", "--fast"), None, ("evaluate", "--fast")),    # not a program: the script's, as always
]


@pytest.mark.parametrize("args, command, script_args", CASES, ids=[" ".join(c[0]) or "(none)" for c in CASES])
def test_rule(args, command, script_args):
    inv = parse(*args)
    assert (inv.command, inv.script_args, inv.dry_run) == (command, script_args, False)


def test_resolved_program():
    assert parse("bash", "-l").program == "/usr/bin/bash"
    assert parse("./tools/prep.sh").program == "/app/code/tools/prep.sh"


def test_dry_run_comes_first_for_both():
    inv = parse("--dry-run", "--steps", "7")
    assert inv.dry_run and inv.command is None and inv.script_args == ("--steps", "7")
    inv = parse("--dry-run", "bash")
    assert inv.dry_run and inv.command == ("bash",)
    assert parse("--dry-run", "--", "yes").script_args == ("yes",)


def test_a_non_python_entrypoint_is_recognised_by_its_own_name_too():
    inv = parse("run.sh", "--fast", script="/app/code/run.sh")
    assert inv.command is None and inv.script_args == ("--fast",)
    inv = parse("/app/code/run.sh", script="/app/code/run.sh")
    assert inv.command is None                               # the launcher runs it, not a bare exec
    assert parse("./run.sh").command == ("./run.sh",)        # another executable: a command


def test_relative_names_resolve_against_the_working_directory():
    assert parse("code/train.py", "-x", cwd="/app").script_args == ("-x",)
    assert parse("train.py", "-x", cwd="/tmp").script_args == ("-x",)   # by name, wherever
