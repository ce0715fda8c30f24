"""Image references for a variant. Pure."""

from __future__ import annotations

from .matrix import Variant


def image_name(repository: str, registry: str | None = None) -> str:
    return f"{registry.rstrip('/')}/{repository}" if registry else repository


def tags(v: Variant, repository: str, version: str, registry: str | None = None) -> list[str]:
    """`<variant>`, `<variant>-<project version>`, then the variant's aliases."""
    name = image_name(repository, registry)
    return [f"{name}:{tag}" for tag in (v.name, f"{v.name}-{version}", *v.aliases)]
