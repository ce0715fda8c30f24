"""The docker command line for a build: BuildKit, overrides for build farms, labels, tags."""

from pathlib import Path

from buildsys.docker_build import BuildOptions, DockerCli, base_image_for, build_command, parse_base_images
from buildsys.matrix import load_matrix
from tests.conftest import ROOT

MATRIX = load_matrix(ROOT / "matrix.yaml")
CPU = MATRIX.variants["cpu"]


def args_of(cmd, flag):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


def test_base_image_overrides_by_distro_or_for_all():
    overrides = parse_base_images(["bookworm=reg.local/debian:bookworm", "trixie=reg.local/debian:trixie"])
    assert base_image_for(CPU, BuildOptions(base_images=overrides)) == "reg.local/debian:bookworm"
    assert base_image_for(MATRIX.variants["cu124"], BuildOptions(base_images=overrides)) == "reg.local/debian:trixie"
    assert base_image_for(CPU, BuildOptions(base_images=parse_base_images(["reg:5000/deb:12"]))) == "reg:5000/deb:12"
    assert base_image_for(CPU, BuildOptions()) == "debian:bookworm-slim"


def test_legacy_client_build_has_buildkit_features():
    options = BuildOptions(ca_cert=Path("/etc/ssl/ca.pem"), pip_index_url="https://pypi.internal/simple",
                           apt_mirror="http://mirror.internal/debian", revision="abc123",
                           created="2026-01-01T00:00:00Z")
    cmd = build_command(DockerCli("/usr/bin/docker", buildx=False), CPU, ["r:cpu", "r:latest"], Path("/ctx"), options)
    assert cmd[:2] == ["/usr/bin/docker", "build"] and "--load" not in cmd
    assert args_of(cmd, "--secret") == ["id=ca_cert,src=/etc/ssl/ca.pem"]
    assert "PIP_INDEX_URL=https://pypi.internal/simple" in args_of(cmd, "--build-arg")
    assert "APT_MIRROR=http://mirror.internal/debian" in args_of(cmd, "--build-arg")
    assert args_of(cmd, "--tag") == ["r:cpu", "r:latest"]
    assert "org.opencontainers.image.revision=abc123" in args_of(cmd, "--label")
    assert "org.opencontainers.image.created=2026-01-01T00:00:00Z" in args_of(cmd, "--label")
    assert args_of(cmd, "--target") == ["runtime"] and cmd[-1] == "/ctx"


def test_the_context_digest_is_a_label_that_changes_with_any_rendered_file():
    from buildsys.render import CONTEXT_LABEL, File, context_digest, render_context

    files = render_context(CPU)
    digest = context_digest(files)
    assert digest == context_digest(list(reversed(render_context(CPU)))) and digest.startswith("sha256:")
    changed = [File(f.path, f.content + b"\n") if f.path == "Dockerfile" else f for f in files]
    moved = [File("x" + f.path, f.content) if f.path == "Dockerfile" else f for f in files]
    assert len({digest, context_digest(changed), context_digest(moved), context_digest(render_context(CPU.leaving_out(["torchvision"])))}) == 4
    cmd = build_command(DockerCli("docker", buildx=True), CPU, ["r:cpu"], Path("/ctx"), BuildOptions(), digest=digest)
    assert f"{CONTEXT_LABEL}={digest}" in args_of(cmd, "--label")


def test_ca_certificate_is_never_a_build_arg():
    cmd = build_command(DockerCli("docker", buildx=True), CPU, ["r:cpu"], Path("/ctx"),
                        BuildOptions(ca_cert=Path("/x/ca.pem")))
    assert not any("ca.pem" in a for a in args_of(cmd, "--build-arg"))
    assert cmd[1:3] == ["buildx", "build"] and "--load" in cmd


def test_export_wheels_targets_the_wheels_stage():
    cmd = build_command(DockerCli("docker", buildx=False), CPU, [], Path("/ctx"), BuildOptions(),
                        target="wheels", output="type=local,dest=/out")
    assert args_of(cmd, "--target") == ["wheels"] and args_of(cmd, "--output") == ["type=local,dest=/out"]
    assert "--tag" not in cmd


def test_cpu_torchvision_needs_a_source_before_anything_is_built(tmp_path):
    import subprocess
    import sys

    import pytest

    from buildsys.docker_build import BuildError, check_companion_sources

    with pytest.raises(BuildError) as info:
        check_companion_sources(CPU, BuildOptions(wheelhouse=tmp_path))
    message = str(info.value)
    assert "\n" not in message and "torchvision 0.28.0+cpu" in message
    assert "--without torchvision" in message and "https://download.pytorch.org/whl/cpu" in message
    (tmp_path / "torchvision-0.28.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    check_companion_sources(CPU, BuildOptions(wheelhouse=tmp_path))                 # from the wheelhouse
    check_companion_sources(CPU, BuildOptions(pip_extra_index_url="https://download.pytorch.org/whl/cpu"))
    check_companion_sources(CPU.leaving_out(["torchvision"]), BuildOptions())
    check_companion_sources(MATRIX.variants["cu124"], BuildOptions())               # PyPI's own wheels

    # The CLI: one line, exit 2, before any docker command (none is on this PATH).
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path), "BUILD_WHEELHOUSE": "", "BUILD_WITHOUT": ""}
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), "build", "cpu", "-o", str(tmp_path / "b")],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--without torchvision" in result.stderr and not (tmp_path / "b").exists()
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), "build", "cpu", "--dry-run", "-o",
                             str(tmp_path / "b"), "--without", "torchvision"], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and " build " in result.stdout, result.stderr


def test_testing_an_image_that_is_not_built_is_one_line(capsys):
    from buildsys.cli import main
    assert main(["--registry", "nowhere.invalid", "test", "cpu-pytorch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["build.py: test cpu-pytorch: no image nowhere.invalid/distributed-training-framework:cpu-pytorch on "
                   "this engine; build it first (build.py build cpu-pytorch)"]
