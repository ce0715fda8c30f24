"""matrix.yaml validation: the real file loads; every kind of bad input is one clear error."""

import copy
from types import SimpleNamespace

import pytest
import yaml

from buildsys import compat
from buildsys.matrix import MatrixError, deep_merge, load_matrix, parse_matrix
from tests.conftest import ROOT

RAW = yaml.safe_load((ROOT / "matrix.yaml").read_text())


def broken(mutate):
    data = copy.deepcopy(RAW)
    mutate(data)
    with pytest.raises(MatrixError) as info:
        parse_matrix(data)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_real_matrix_loads_with_the_required_variants():
    matrix = load_matrix(ROOT / "matrix.yaml")
    variants = matrix.variants
    assert variants["cpu"].python == "3.11" and variants["cpu"].accelerator == "cpu"
    assert compat.parse_version(variants["cpu"].pytorch.version) >= (2, 6)
    assert variants["cpu"].keras() == "tf-keras"
    assert set(variants["cpu"].horovod.controllers) == {"gloo", "mpi"}
    assert variants["cu124"].cuda.version == "12.4" and variants["cu124"].pytorch.version.startswith("2.6")
    newer = [v for v in variants.values() if v.cuda and compat.parse_version(v.cuda.version) > (12, 4)]
    assert newer, "at least one CUDA 12.x newer than 12.4"
    for v in variants.values():
        if v.cuda:
            assert v.horovod.gpu_operations == "nccl"
    assert any(v.pytorch and not v.tensorflow for v in variants.values()), "a slim PyTorch-only variant"


def test_defaults_merge_key_by_key():
    assert deep_merge({"a": {"x": 1, "y": 2}, "b": 1}, {"a": {"y": 3}}) == {"a": {"x": 1, "y": 3}, "b": 1}


def test_unknown_key_names_variant_field_and_allowed_keys():
    message = broken(lambda d: d["variants"]["cpu"].update(gpus=2))
    assert "variant 'cpu'" in message and "field 'gpus'" in message and "allowed:" in message
    assert "size_budget_gb" in message


def test_unknown_nested_key():
    message = broken(lambda d: d["variants"]["cpu"]["pytorch"].update(index="x"))
    assert "field 'pytorch.index'" in message and "allowed: version" in message


def test_unknown_top_level_key():
    message = broken(lambda d: d.update(images=[]))
    assert "'images'" in message and "allowed: defaults, repository, variants" in message


def test_wrong_type_number_as_string():
    message = broken(lambda d: d["variants"]["cpu"].update(size_budget_gb="big"))
    assert "field 'size_budget_gb'" in message and "allowed: a number" in message


# --------------------------------------------------------------------------- verified: what a build measured

def test_every_variant_records_a_real_build():
    for v in load_matrix(ROOT / "matrix.yaml").variants.values():
        assert v.verified.how in ("ci", "built"), v.name
        assert 0 < v.verified.size_gb <= v.size_budget_gb, v.name


def test_render_only_is_no_longer_a_verification():
    message = broken(lambda d: d["variants"]["cu128"].update(verified="render-only"))
    assert "field 'verified'" in message and "a mapping of how, date, build_minutes, size_gb" in message


def test_verified_how_is_ci_or_built():
    message = broken(lambda d: d["variants"]["cu128"]["verified"].update(how="render-only"))
    assert "field 'verified.how'" in message and "'ci'" in message and "'built'" in message


def test_verified_date_is_a_date():
    message = broken(lambda d: d["variants"]["cu128"]["verified"].update(date="today"))
    assert "field 'verified.date'" in message and "YYYY-MM-DD" in message


def test_verified_size_over_the_budget():
    message = broken(lambda d: d["variants"]["cpu"]["verified"].update(size_gb=9.5))
    assert "field 'verified.size_gb'" in message and "9.5 is over size_budget_gb 3.5" in message


def test_verified_needs_every_field():
    message = broken(lambda d: d["variants"]["cpu"]["verified"].pop("size_gb"))
    assert "field 'verified.size_gb'" in message


def test_wrong_type_python_as_float():
    message = broken(lambda d: d["variants"]["cpu"].update(python=3.11))
    assert "field 'python'" in message and "allowed: a string" in message


def test_wrong_type_list_as_string():
    message = broken(lambda d: d["variants"]["cpu"]["horovod"].update(frameworks="pytorch"))
    assert "field 'horovod.frameworks'" in message and "a list" in message


def test_bad_enum_value_lists_choices():
    message = broken(lambda d: d["variants"]["cpu"].update(accelerator="rocm"))
    assert "'rocm'" in message and "'cpu', 'cuda', 'tpu'" in message


def test_unknown_horovod_framework_lists_the_choices():
    message = broken(lambda d: d["variants"]["cpu"]["horovod"].update(frameworks=["jax"]))
    assert "'jax'" in message and "'pytorch', 'tensorflow', 'mxnet'" in message


def test_horovod_with_mxnet_needs_mxnet_installed():
    message = broken(lambda d: d["variants"]["cpu"]["horovod"].update(frameworks=["pytorch", "mxnet"]))
    assert "field 'horovod.frameworks'" in message and "'mxnet' is not installed" in message


def test_mxnet_variant_loads_cpu_only_on_python_3_11():
    v = load_matrix(ROOT / "matrix.yaml").variants["cpu-mxnet"]
    assert v.mxnet.version == "1.9.1" and v.accelerator == "cpu" and v.python == "3.11"
    assert v.frameworks() == ["pytorch", "mxnet"] and v.horovod_frameworks() == ["pytorch", "mxnet"]
    assert compat.numpy_requirement(v) == "numpy<1.24"


def test_mxnet_needs_a_python_with_numpy_below_1_24():
    message = broken(lambda d: d["variants"]["cu126"].update(mxnet={"version": "1.9.1"}, accelerator="cpu",
                                                               cuda=None, pytorch={"version": "2.7.1+cpu"},
                                                               tensorflow=None, horovod={"frameworks": ["pytorch"]}))
    assert "field 'mxnet.version'" in message and "numpy < 1.24" in message and "Python 3.13" in message
    assert "3.8..3.11" in message


def test_mxnet_on_cuda_is_refused():
    message = broken(lambda d: d["variants"]["cu124"].update(mxnet={"version": "1.9.1"}))
    assert "field 'mxnet.version'" in message and "CUDA 11.7" in message and "accelerator 'cpu'" in message


def test_mxnet_and_tensorflow_need_a_common_numpy():
    message = broken(lambda d: d["variants"]["cpu"].update(mxnet={"version": "1.9.1"}))
    assert "field 'tensorflow.version'" in message and "numpy >= 1.26.0" in message
    assert "numpy < 1.24" in message and "2.15, 2.16, 2.17" in message


def test_mxnet_needs_torch_for_the_job_store():
    message = broken(lambda d: d["variants"]["cpu-mxnet"].update(pytorch=None, horovod={"frameworks": ["mxnet"]}))
    assert "field 'pytorch'" in message and "TCPStore" in message


def test_unknown_mxnet_release():
    message = broken(lambda d: d["variants"]["cpu-mxnet"]["mxnet"].update(version="2.0.0"))
    assert "field 'mxnet.version'" in message and "allowed minors: 1.9" in message


def test_missing_required_field():
    message = broken(lambda d: d["variants"]["cu124"]["cuda"].pop("nccl"))
    assert "field 'cuda.nccl'" in message and "required" in message


def test_torch_cuda_mismatch():
    message = broken(lambda d: d["variants"]["cu124"]["cuda"].update(version="12.8"))
    assert "field 'cuda.version'" in message and "torch 2.6" in message and "12.4" in message


def test_torch_pypi_wheel_is_another_cuda():
    message = broken(lambda d: d["variants"]["cu124"]["cuda"].update(version="12.6"))
    assert "field 'pytorch.version'" in message and "'2.6.0+cu126'" in message


def test_cpu_variant_needs_cpu_torch():
    message = broken(lambda d: d["variants"]["cpu"]["pytorch"].update(version="2.6.0"))
    assert "field 'pytorch.version'" in message and "+cpu" in message


def test_torch_pins_cudnn():
    message = broken(lambda d: d["variants"]["cu124"]["cuda"].update(cudnn="9.3.0.75"))
    assert "field 'cuda.cudnn'" in message and "9.1.0.70" in message


def test_tensorflow_cuda_too_old():
    def mutate(d):
        d["variants"]["cu124"]["tensorflow"] = {"package": "tensorflow", "version": "2.20.0", "keras": "tf-keras"}
        d["variants"]["cu124"]["horovod"]["frameworks"] = ["pytorch", "tensorflow"]
    message = broken(mutate)
    assert "field 'cuda.version'" in message and "TensorFlow 2.20" in message and "12.5" in message


def test_tensorflow_python_mismatch():
    message = broken(lambda d: d["variants"]["cu126"]["tensorflow"].update(version="2.19.0"))
    assert "field 'tensorflow.version'" in message and "Python 3.13" in message and "3.9..3.12" in message


def test_keras3_with_horovod_is_rejected():
    message = broken(lambda d: d["variants"]["cpu"]["tensorflow"].update(keras="keras3"))
    assert "field 'tensorflow.keras'" in message and "Keras 3" in message and "'tf-keras'" in message


def test_cuda_tensorflow_package_must_have_gpu_support():
    message = broken(lambda d: d["variants"]["cu126"]["tensorflow"].update(package="tensorflow-cpu"))
    assert "field 'tensorflow.package'" in message and "allowed: 'tensorflow'" in message


def test_python_follows_the_distro():
    message = broken(lambda d: d["variants"]["cpu"].update(python="3.12"))
    assert "field 'python'" in message and "bookworm" in message and "'3.11'" in message


def test_cuda_variant_needs_nccl_horovod():
    message = broken(lambda d: d["variants"]["cu124"]["horovod"].update(gpu_operations=None))
    assert "field 'horovod.gpu_operations'" in message and "'nccl'" in message


def test_gpu_operations_on_cpu_variant():
    message = broken(lambda d: d["variants"]["cpu"]["horovod"].update(gpu_operations="nccl"))
    assert "field 'horovod.gpu_operations'" in message


def test_horovod_framework_must_be_installed():
    message = broken(lambda d: d["variants"]["cpu-pytorch"]["horovod"].update(frameworks=["pytorch", "tensorflow"]))
    assert "field 'horovod.frameworks'" in message and "'tensorflow' is not installed" in message


def test_unpatched_horovod_version():
    message = broken(lambda d: d["defaults"]["horovod"].update(version="0.27.0"))
    assert "field 'horovod.version'" in message and "0.28.1" in message


def test_cuda_on_a_distro_without_nvcc():
    message = broken(lambda d: d["variants"]["cu124"].update(distro="bookworm", python="3.11"))
    assert "field 'distro'" in message and "trixie" in message


def test_cuda_13_takes_its_compiler_from_pypi_on_any_distro():
    """CUDA 12's nvcc is Debian trixie's (12.4); CUDA 13's comes from PyPI's cuda-toolkit
    wheels, so cu130 builds on bookworm; an unknown CUDA major has no compiler."""
    cu130 = load_matrix(ROOT / "matrix.yaml").variants["cu130"]
    assert cu130.distro == "bookworm" and compat.cuda_compiler(cu130).source == "pypi"
    assert compat.cuda_compiler(load_matrix(ROOT / "matrix.yaml").variants["cu124"]).source == "debian"
    cuda14 = SimpleNamespace(accelerator="cuda", distro="bookworm", cuda=SimpleNamespace(version="14.0",
                                                                                         arch_list=["9.0"]))
    [(field, message)] = compat.check_cuda_toolchain(cuda14)
    assert field == "cuda.version" and "no CUDA compiler is known for CUDA 14.0" in message


def test_cuda_13_refuses_compute_capabilities_its_nvcc_dropped():
    message = broken(lambda d: d["variants"]["cu130"]["cuda"].update(arch_list=["7.0", "8.0"]))
    assert "field 'cuda.arch_list'" in message and "7.0" in message and "7.5 and newer" in message


def test_cuda_13_wheels_are_named_for_their_major():
    message = broken(lambda d: d["variants"]["cu130"]["cuda"].update(nccl="2.27.3"))
    assert "field 'cuda.nccl'" in message and "nvidia-nccl-cu13" in message and "'2.30.7'" in message


def test_tensorflow_cannot_share_cuda_13():
    def add_tf(d):
        d["variants"]["cu130"]["tensorflow"] = {"package": "tensorflow", "version": "2.21.0", "keras": "tf-keras"}
    message = broken(add_tf)
    assert "field 'cuda.version'" in message and "CUDA 12.5 or a newer 12.x" in message


def test_alias_collision():
    message = broken(lambda d: d["variants"]["cpu-pytorch"].update(aliases=["latest"]))
    assert "field 'aliases'" in message and "'latest'" in message


def test_bad_arch():
    message = broken(lambda d: d["variants"]["cu124"]["cuda"].update(arch_list=["sm_90"]))
    assert "field 'cuda.arch_list'" in message and "compute capability" in message


def test_tpu_variant_pairs_torch_xla_with_its_torch_and_libtpu():
    tpu = load_matrix(ROOT / "matrix.yaml").variants["tpu"]
    release = compat.TORCH_XLA[tpu.xla.version]
    assert compat.minor(tpu.pytorch.version) == release.torch and tpu.xla.libtpu == release.libtpu
    assert tpu.frameworks() == ["pytorch"] and tpu.launchers() == ["native"] and not tpu.compiles_wheels()


def test_torch_xla_needs_its_own_torch():
    message = broken(lambda d: d["variants"]["tpu"]["pytorch"].update(version="2.8.0"))
    assert "field 'pytorch.version'" in message and "torch-xla 2.9.0 is built against torch 2.9" in message


def test_tpu_torch_is_pypi_or_cpu_build():
    message = broken(lambda d: d["variants"]["tpu"]["pytorch"].update(version="2.9.0+cu126"))
    assert "field 'pytorch.version'" in message and "'2.9.0+cpu'" in message


def test_libtpu_is_the_one_torch_xla_pins():
    message = broken(lambda d: d["variants"]["tpu"]["xla"].update(libtpu="0.0.17"))
    assert "field 'xla.libtpu'" in message and "allowed: '0.0.21'" in message


def test_libtpu_has_no_python_3_13_wheels():
    message = broken(lambda d: d["variants"]["tpu"].update(distro="trixie", python="3.13"))
    assert "field 'xla.libtpu'" in message and "Python 3.13" in message and "3.10..3.12" in message


def test_unknown_torch_xla_release():
    message = broken(lambda d: d["variants"]["tpu"]["xla"].update(version="2.10.0"))
    assert "field 'xla.version'" in message and "2.9.0" in message


def test_torch_xla_only_on_a_tpu_variant():
    message = broken(lambda d: d["variants"]["cpu"].update(xla={"version": "2.9.0", "libtpu": "0.0.21"}))
    assert "field 'xla'" in message and "accelerator 'tpu'" in message


def test_tpu_variant_needs_torch_xla():
    message = broken(lambda d: d["variants"]["tpu"].pop("xla"))
    assert "field 'xla'" in message and "needs torch-xla" in message


def test_tpu_variant_refuses_horovod_and_tensorflow():
    message = broken(lambda d: d["variants"]["tpu"].update(horovod={"frameworks": ["pytorch"]}))
    assert "field 'horovod'" in message and "no XLA device support" in message
    message = broken(lambda d: d["variants"]["tpu"].update(
        tensorflow={"package": "tensorflow", "version": "2.20.0", "keras": "tf-keras"}))
    assert "field 'tensorflow'" in message and "libtpu" in message


def test_cuda_block_on_a_tpu_variant():
    message = broken(lambda d: d["variants"]["tpu"].update(cuda=d["variants"]["cu124"]["cuda"]))
    assert "field 'cuda'" in message and "'tpu'" in message


def test_version_helpers():
    assert compat.parse_version("2.13.0+cpu") == (2, 13, 0)
    assert compat.minor("2.6.0") == "2.6"
    assert compat.local_tag("2.6.0+cu124") == "cu124" and compat.local_tag("2.6.0") is None
    assert compat.cuda_tag("12.4") == "cu124"


def test_every_cpu_and_cuda_pytorch_variant_pins_its_torchvision():
    for v in load_matrix(ROOT / "matrix.yaml").variants.values():
        if v.pytorch and v.accelerator in ("cpu", "cuda"):
            pair = compat.TORCH_COMPANIONS[v.pytorch.version.split("+")[0]]
            assert v.pytorch.torchvision.split("+")[0] == pair.torchvision
            assert compat.local_tag(v.pytorch.torchvision) == compat.local_tag(v.pytorch.version)


def test_torchvision_for_another_torch():
    message = broken(lambda d: d["variants"]["cu124"]["pytorch"].update(torchvision="0.22.1"))
    assert "field 'pytorch.torchvision'" in message and "torch 2.6.0" in message and "'0.21.0'" in message


def test_pypi_torchvision_next_to_a_cpu_torch():
    message = broken(lambda d: d["variants"]["cpu"]["pytorch"].update(torchvision="0.28.0"))
    assert "field 'pytorch.torchvision'" in message and "'0.28.0+cpu'" in message and "torchvision::nms" in message


def test_torchaudio_where_torch_has_none():
    message = broken(lambda d: d["variants"]["cpu"]["pytorch"].update(torchaudio="2.13.0+cpu"))
    assert "field 'pytorch.torchaudio'" in message and "torch 2.13.0 has no torchaudio" in message


def test_without_names_a_companion():
    message = broken(lambda d: d["variants"]["cpu"].update(without=["numpy"]))
    assert "field 'without.0'" in message and "'torchvision', 'torchaudio'" in message


def test_leaving_out_keeps_the_pin_and_drops_the_install():
    cpu = load_matrix(ROOT / "matrix.yaml").variants["cpu"]
    assert cpu.torch_companions() == {"torchvision": "0.28.0+cpu"}
    bare = cpu.leaving_out(["torchvision", "torchaudio"])
    assert bare.without == ["torchvision"] and bare.torch_companions() == {}
    assert bare.pytorch.torchvision == "0.28.0+cpu"
    assert cpu.leaving_out([]) is cpu
# --------------------------------------------------------------------------- one copy of each CUDA wheel

def variant_without_checks(name: str, **changes):
    """A variant from the real matrix with `changes` merged in, validated for types only, so
    that one compat check can be tried on its own."""
    from buildsys.matrix import Variant
    body = deep_merge(deep_merge(RAW["defaults"], RAW["variants"][name]), changes)
    return Variant.model_validate({"name": name, **body})


def test_torch_and_tensorflow_share_one_copy_of_each_cuda_wheel_in_the_real_matrix():
    matrix = load_matrix(ROOT / "matrix.yaml")
    for v in matrix.variants.values():
        assert compat.check_cuda_wheels(v) == []
    # The only wheel TensorFlow asks for that torch does not pin is held to the variant's CUDA.
    assert compat.tensorflow_only_cuda_wheels(matrix.variants["cu126"]) == {"nvidia-cuda-nvcc-cu12": "==12.6.*"}
    assert compat.tensorflow_only_cuda_wheels(matrix.variants["cu128"]) == {"nvidia-cuda-nvcc-cu12": "==12.8.*"}
    assert compat.tensorflow_only_cuda_wheels(matrix.variants["cu124"]) == {}


def test_torch_pins_agree_with_the_torch_table():
    for release, pins in compat.TORCH_CUDA_WHEELS.items():
        assert pins["nvidia-cudnn-cu12"] == compat.TORCH[release].cudnn, release
        assert pins["nvidia-nccl-cu12"] == compat.TORCH[release].nccl, release
    for release, wanted in compat.TENSORFLOW_CUDA_WHEELS.items():
        nccl_low = wanted["nvidia-nccl-cu12"].lstrip("=>").split(",")[0]
        assert nccl_low == compat.TENSORFLOW[release].nccl_min, release


def test_a_torch_pin_outside_tensorflows_range_is_one_line_naming_both():
    v = variant_without_checks("cu126", tensorflow={"version": "2.21.0"})
    (field, message), = compat.check_cuda_wheels(v)
    assert field == "tensorflow.version"
    assert "TensorFlow 2.21 needs nvidia-nccl-cu12>=2.27.7,<3.0 but torch 2.7.1 pins ==2.26.2" in message
    assert "allowed: TensorFlow 2.20 with torch 2.7; one variant per framework" in message


def test_tensorflows_exact_pins_fit_no_torch():
    v = variant_without_checks("cu126", tensorflow={"version": "2.19.0"})
    (field, message), = compat.check_cuda_wheels(v)
    assert "TensorFlow 2.19 needs nvidia-cublas-cu12==12.5.3.2 but torch 2.7.1 pins ==12.6.4.1" in message
    assert "allowed: TensorFlow 2.20 with torch 2.7; one variant per framework" in message
    assert "with TensorFlow 2.19" not in message           # no torch fits its exact pins


def test_tensorflow_without_recorded_cuda_wheels():
    v = variant_without_checks("cu126", tensorflow={"version": "2.17.0"})
    (field, message), = compat.check_cuda_wheels(v)
    assert field == "tensorflow.version" and "not recorded" in message and "2.18, 2.19, 2.20, 2.21" in message


def test_torch_from_the_pytorch_index_has_no_recorded_pins():
    message = broken(lambda d: d["variants"]["cu126"]["pytorch"].update(version="2.7.1+cu128",
                                                                        torchvision="0.22.1+cu128",
                                                                        torchaudio="2.7.1+cu128")
                     or d["variants"]["cu126"]["cuda"].update(version="12.8"))
    assert "field 'pytorch.version'" in message and "2.7.1+cu128" in message and "not recorded" in message


def test_a_tensorflow_only_wheel_outside_the_variants_cuda(monkeypatch):
    wanted = dict(compat.TENSORFLOW_CUDA_WHEELS["2.20"], **{"nvidia-cuda-nvcc-cu12": ">=12.9,<13.0"})
    monkeypatch.setitem(compat.TENSORFLOW_CUDA_WHEELS, "2.20", wanted)
    (field, message), = compat.check_cuda_wheels(variant_without_checks("cu126"))
    assert field == "cuda.version" and "nvidia-cuda-nvcc-cu12>=12.9,<13.0" in message and "CUDA 12.6" in message

