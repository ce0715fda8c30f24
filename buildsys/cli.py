"""Build the distributed-training image matrix: the command line (`python build.py`, or
`disttrain-build` once the project is installed with pip).

    python build.py list                       every variant, its tags and versions
    python build.py render [VARIANT...]        Dockerfile + build context per variant
    python build.py build  [VARIANT...]        BuildKit build, tag, label (--push to publish)
    python build.py test   [VARIANT...]        smoke tests inside built images
    python build.py ci-matrix                  JSON job matrix for CI

A thin CLI: the work is in buildsys/ (matrix, compat, render, tags, docker_build, smoke, ci).
It works on a checkout of the project (matrix.yaml, images/, the code the images carry):
the one it is installed from (`pip install -e .`), else the current folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from buildsys import ci, compat, docker_build, render, smoke
from buildsys.matrix import MatrixError, load_matrix
from buildsys.render import REPO_ROOT as ROOT
from buildsys.tags import tags as variant_tags


def env_default(name: str, default=None):
    """Every option has an environment fallback (BUILD_<OPTION>), listed in --help."""
    return os.environ.get(name, default)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=os.path.basename(sys.argv[0]) or "build.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--matrix", default=env_default("BUILD_MATRIX", str(ROOT / "matrix.yaml")),
                   help="matrix file (env BUILD_MATRIX; default: matrix.yaml)")
    p.add_argument("--registry", default=env_default("BUILD_REGISTRY"),
                   help="registry prefix for tags, e.g. ghcr.io/acme (env BUILD_REGISTRY)")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="show every variant with tags and component versions")

    r = sub.add_parser("render", help="write each variant's Dockerfile and build context")
    r.add_argument("variants", nargs="*", metavar="VARIANT")
    r.add_argument("--output-dir", "-o", default=env_default("BUILD_OUTPUT_DIR", str(ROOT / "build")),
                   help="folder for the contexts, one subfolder per variant (env BUILD_OUTPUT_DIR)")

    b = sub.add_parser("build", help="build images with BuildKit",
                       description="Build images with BuildKit. Options for air-gapped and proxied "
                                   "build farms: --wheelhouse, --pip-index-url, --base-image, "
                                   "--apt-mirror, --ca-cert.")
    b.add_argument("variants", nargs="*", metavar="VARIANT")
    b.add_argument("--output-dir", "-o", default=env_default("BUILD_OUTPUT_DIR", str(ROOT / "build")))
    b.add_argument("--base-image", action="append", default=[], metavar="[DISTRO=]IMAGE",
                   help="replace the Debian base image: 'bookworm=registry.local/debian:bookworm-slim' "
                        "for one distro, or a plain IMAGE for every selected variant (repeatable; "
                        "env BUILD_BASE_IMAGES, comma-separated)")
    b.add_argument("--wheelhouse", default=env_default("BUILD_WHEELHOUSE"),
                   help="folder of local wheels offered to pip as --find-links; bind-mounted while "
                        "building, never copied into a layer (env BUILD_WHEELHOUSE)")
    b.add_argument("--pip-index-url", default=env_default("BUILD_PIP_INDEX_URL"),
                   help="package index replacing PyPI (env BUILD_PIP_INDEX_URL). Build args are "
                        "recorded in the image history: keep credentials out of URLs")
    b.add_argument("--pip-extra-index-url", default=env_default("BUILD_PIP_EXTRA_INDEX_URL"),
                   help="additional package index (env BUILD_PIP_EXTRA_INDEX_URL)")
    b.add_argument("--apt-mirror", default=env_default("BUILD_APT_MIRROR"),
                   help="Debian mirror replacing http://deb.debian.org/debian (env BUILD_APT_MIRROR)")
    b.add_argument("--ca-cert", default=env_default("BUILD_CA_CERT"),
                   help="PEM file of extra CA certificates trusted while building (a TLS-intercepting "
                        "proxy); passed as a BuildKit secret, never stored in a layer (env BUILD_CA_CERT)")
    b.add_argument("--without", action="append", default=[], choices=["torchvision", "torchaudio"],
                   help="leave a pinned torch companion out of the image (repeatable; env BUILD_WITHOUT, "
                        "comma-separated), e.g. where PyTorch's CPU torchvision cannot be reached; the "
                        "image's labels and manifest record it")
    b.add_argument("--push", action="store_true", help="push every tag after building")
    b.add_argument("--no-cache", action="store_true", help="build without Docker's layer cache")
    b.add_argument("--pull", action="store_true", help="always look for a newer base image")
    b.add_argument("--progress", choices=["auto", "plain", "tty"], default=env_default("BUILD_PROGRESS", "auto"),
                   help="BuildKit progress output (env BUILD_PROGRESS)")
    b.add_argument("--cache-from", action="append", default=[], help="buildx cache source (repeatable)")
    b.add_argument("--cache-to", help="buildx cache destination")
    b.add_argument("--export-wheels", metavar="DIR",
                   help="also copy the compiled Horovod and mpi4py wheels to DIR")
    b.add_argument("--docker-cli", default=env_default("DOCKER_CLI"),
                   help="docker client to use (env DOCKER_CLI); default: the first one with BuildKit")
    b.add_argument("--dry-run", action="store_true", help="render and print the commands, build nothing")

    t = sub.add_parser("test", help="smoke-test built images")
    t.add_argument("variants", nargs="*", metavar="VARIANT")

    sub.add_parser("ci-matrix", help="print the CI job matrix as JSON")
    return p


def git_revision() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def cmd_list(matrix, version, registry) -> int:
    for v in matrix.variants.values():
        versions = render.component_versions(v)
        hvd = render.horovod_build(v)
        seen = v.verified
        minutes = f"{seen.build_minutes:g} min cold build, " if seen.build_minutes else ""
        print(f"{v.name}  [{seen.how} {seen.date}: {minutes}{seen.size_gb:g} GB]  {v.description}")
        print(f"  tags:        {', '.join(variant_tags(v, matrix.repository, version, registry))}")
        print(f"  base:        {v.base_image()}  python {v.python}  accelerator {v.accelerator}")
        if v.cuda:
            nvcc = compat.cuda_compiler(v)
            print(f"  cuda:        CUDA {v.cuda.version}, cuDNN {v.cuda.cudnn}, NCCL {v.cuda.nccl} "
                  f"(nvidia-nccl-cu{compat.cuda_major(v.cuda.version)}), arch {','.join(v.cuda.arch_list)}, "
                  f"nvcc {nvcc.cuda} ({nvcc.source})")
        print(f"  torch:       {versions.get('torch', '-')}")
        if v.xla:
            print(f"  torch-xla:   {v.xla.version}, libtpu {v.xla.libtpu}")
        tf = f"{v.tensorflow.package} {v.tensorflow.version}, Keras: {v.keras()}" if v.tensorflow else "-"
        print(f"  tensorflow:  {tf}")
        if v.mxnet:
            print(f"  mxnet:       {v.mxnet.version} ({compat.numpy_requirement(v)})")
        if hvd:
            print(f"  horovod:     {v.horovod.version} with {', '.join(hvd['frameworks'])}; controllers "
                  f"{', '.join(hvd['controllers'])}; tensor ops {', '.join(hvd['tensor_operations'])}")
        print(f"  mpi4py:      {v.mpi4py or '-'}")
        print(f"  entrypoint:  FRAMEWORK={'|'.join(v.frameworks())}  LAUNCHER={'|'.join(v.launchers())}")
        print(f"  size budget: {v.size_budget_gb} GB")
    return 0


def cmd_render(matrix, args) -> int:
    for v in matrix.select(args.variants):
        out = render.write_context(render.render_context(v, matrix.cuda_variants()), Path(args.output_dir) / v.name)
        print(f"{v.name}: {out}")
    return 0


def cmd_build(matrix, version, args) -> int:
    base_images = list(args.base_image)
    if not base_images and os.environ.get("BUILD_BASE_IMAGES"):
        base_images = [x for x in os.environ["BUILD_BASE_IMAGES"].split(",") if x]
    for name, value in (("--ca-cert", args.ca_cert), ("--wheelhouse", args.wheelhouse)):
        if value and not Path(value).exists():
            raise docker_build.BuildError(f"{name} {value}: no such file or folder")
    options = docker_build.BuildOptions(
        base_images=docker_build.parse_base_images(base_images),
        apt_mirror=args.apt_mirror, pip_index_url=args.pip_index_url,
        pip_extra_index_url=args.pip_extra_index_url,
        ca_cert=Path(args.ca_cert) if args.ca_cert else None,
        wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None,
        no_cache=args.no_cache, pull=args.pull, progress=args.progress,
        cache_from=tuple(args.cache_from), cache_to=args.cache_to, revision=git_revision())
    without = args.without or [x.strip() for x in os.environ.get("BUILD_WITHOUT", "").split(",") if x.strip()]
    for name in without:
        if name not in ("torchvision", "torchaudio"):
            raise docker_build.BuildError(f"BUILD_WITHOUT={os.environ['BUILD_WITHOUT']!r}: allowed: "
                                          f"torchvision, torchaudio (comma-separated)")
    variants = [v.leaving_out(without) for v in matrix.select(args.variants)]
    for v in variants:                 # every variant's sources, before any layer is built
        docker_build.check_companion_sources(v, options)
    cli = docker_build.DockerCli(args.docker_cli or "docker", buildx=False) if args.dry_run \
        else docker_build.find_docker_cli(args.docker_cli)
    for v in variants:
        refs = variant_tags(v, matrix.repository, version, args.registry)
        context, digest = docker_build.stage_context(v, Path(args.output_dir) / v.name, options.wheelhouse,
                                                     matrix.cuda_variants())
        if args.dry_run:
            print(" ".join(docker_build.build_command(cli, v, refs, context, options, digest=digest)))
            continue
        docker_build.build(cli, v, refs, context, options, digest=digest)
        if args.export_wheels:
            docker_build.export_wheels(cli, v, context, options, Path(args.export_wheels))
        print(f"built {v.name}: {', '.join(refs)}", flush=True)
        if args.push:
            docker_build.push(refs)
    return 0


def cmd_test(matrix, version, args) -> int:
    failed = 0
    for v in matrix.select(args.variants):
        image = variant_tags(v, matrix.repository, version, args.registry)[0]
        if not docker_build.image_exists(image):
            raise docker_build.BuildError(f"test {v.name}: no image {image} on this engine; "
                                          f"build it first (build.py build {v.name})")
        print(f"== {v.name} ({image})", flush=True)
        for result in smoke.run_smoke_tests(image, v):
            print(f"  [{'PASS' if result.ok else 'FAIL'}] {result.name}: {result.detail}", flush=True)
            failed += not result.ok
    print(f"{'FAILED' if failed else 'OK'}: {failed} smoke check(s) failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    version = render.PROJECT_VERSION
    if not (ROOT / "images" / "Dockerfile.j2").is_file():
        print(f"{parser().prog}: no checkout of the project here ({Path.cwd()} has no images/Dockerfile.j2); "
              f"run it in one", file=sys.stderr)
        return 2
    try:
        matrix = load_matrix(args.matrix)
        if args.command == "list":
            return cmd_list(matrix, version, args.registry)
        if args.command == "render":
            return cmd_render(matrix, args)
        if args.command == "build":
            return cmd_build(matrix, version, args)
        if args.command == "test":
            return cmd_test(matrix, version, args)
        if args.command == "ci-matrix":
            print(json.dumps(ci.ci_matrix(matrix, version, args.registry), indent=2))
            return 0
    except (MatrixError, docker_build.BuildError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
