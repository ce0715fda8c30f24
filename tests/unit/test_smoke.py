"""The smoke tests' verdicts are pure: parsed from what the image printed."""

from buildsys import smoke
from buildsys.matrix import load_matrix
from tests.conftest import ROOT

TPU = load_matrix(ROOT / "matrix.yaml").variants["tpu"]


def test_xla_reduction_must_span_the_devices():
    good = "RESULT xla devices=2 sharding={devices=[2,1]0,1} sum=[3.0, 3.0, 3.0, 3.0]"
    assert smoke.check_xla_reduction(good, 2, 4)[0]
    ok, detail = smoke.check_xla_reduction(good.replace("devices=2 ", "devices=1 "), 2, 4)
    assert not ok and "devices=1" in detail
    assert not smoke.check_xla_reduction(good.replace("3.0", "1.0"), 2, 4)[0]
    assert not smoke.check_xla_reduction("nothing", 2, 4)[0]


def test_versions_of_torch_xla_and_libtpu_are_checked():
    line = 'VERSIONS {"libtpu": "0.0.21", "torch": "2.9.0+cu128", "torch_xla": "2.9.0"}'
    assert smoke.compare_versions(line, TPU)[0]           # PyPI's torch reports its CUDA local tag
    ok, detail = smoke.compare_versions(line.replace('"0.0.21"', '"0.0.17"'), TPU)
    assert not ok and "libtpu" in detail
