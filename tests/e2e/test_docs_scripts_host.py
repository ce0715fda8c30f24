"""docs/train-script.md's smallest scripts, run as written: each fenced Python block that is
a whole script (not the resume snippet) trains as a one-node job of two processes."""

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

PAGE = ROOT / "docs" / "train-script.md"
# The page's whole scripts, in order, and how each is started (the variables its heading names).
RUNS = [{"FRAMEWORK": "pytorch"}, {"FRAMEWORK": "keras"}, {"LAUNCHER": "horovod"}]


def scripts() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    return [b for b in blocks if "..." not in b]          # the resume snippet is a fragment


def test_the_page_has_one_whole_script_per_framework():
    assert len(scripts()) == len(RUNS)


@pytest.mark.parametrize("index", range(len(RUNS)), ids=["pytorch", "keras", "horovod"])
def test_each_smallest_script_trains_as_written(jobs, tmp_path, index):
    script = tmp_path / "train.py"
    script.write_text(scripts()[index])
    codes, out = jobs.run(1, [], timeout=180, ENTRYPOINT=str(script), NPROC_PER_NODE=2, **RUNS[index])
    assert codes == [0], out[-4000:]
    if index != 1:
        assert "rank 0 of 2: loss" in out and "rank 1 of 2: loss" in out, out[-3000:]
    else:
        assert out.count("loss ") >= 2, out[-3000:]
