"""The CI job matrix (`build.py ci-matrix`). Pure."""

from __future__ import annotations

from .matrix import Matrix
from .tags import tags


def ci_matrix(matrix: Matrix, version: str, registry: str | None = None) -> dict:
    """GitHub Actions `strategy.matrix` JSON: one job per variant, with what the job needs."""
    include = []
    for v in matrix.variants.values():
        include.append({
            "variant": v.name,
            "accelerator": v.accelerator,
            "distro": v.distro,
            "python": v.python,
            "verified": v.verified.how,
            # CUDA images need tens of GB while building, the TPU one (PyPI's CUDA torch) ~8 GB:
            # the job frees the runner's disk first.
            "free_disk": v.accelerator in ("cuda", "tpu"),
            "tags": tags(v, matrix.repository, version, registry),
        })
    return {"include": include}
