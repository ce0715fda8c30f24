"""matrix.yaml -> validated Variant objects.

The file has `repository`, a `defaults` block and `variants`. Each variant is the
defaults deep-merged with its own mapping, then validated by pydantic (unknown keys,
types, allowed values) and by compat.check_variant (combinations). Any problem becomes
one MatrixError line: `matrix.yaml: variant 'cpu': field 'cuda.version': ...`.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import compat

VERSION_RE = re.compile(r"^\d+(\.\d+)*(\+[A-Za-z0-9.]+)?$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


class MatrixError(Exception):
    """A problem in matrix.yaml; str() is one line naming variant, field and allowed values."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _version(value: str) -> str:
    if not VERSION_RE.match(value):
        raise ValueError(f"{value!r} is not a version like '2.6.0' or '2.13.0+cpu'")
    return value


class PyTorch(Strict):
    version: str
    torchvision: str | None = None       # the build made for this torch (compat.TORCH_COMPANIONS)
    torchaudio: str | None = None

    @field_validator("version", "torchvision", "torchaudio")
    @classmethod
    def _check(cls, value: str | None) -> str | None:
        return value if value is None else _version(value)


class TensorFlow(Strict):
    package: Literal["tensorflow", "tensorflow-cpu"]
    version: str
    keras: Literal["tf-keras", "keras3", "keras2"] | None = None

    _check = field_validator("version")(classmethod(lambda cls, v: _version(v)))


class MXNet(Strict):
    version: str

    _check = field_validator("version")(classmethod(lambda cls, v: _version(v)))


class Cuda(Strict):
    version: str
    cudnn: str
    nccl: str
    arch_list: list[str] = Field(min_length=1)

    @field_validator("version")
    @classmethod
    def _cuda_version(cls, value: str) -> str:
        if not re.match(r"^\d+\.\d+$", value):
            raise ValueError(f"{value!r} is not a CUDA version like '12.4'")
        return value

    _check = field_validator("cudnn", "nccl")(classmethod(lambda cls, v: _version(v)))

    @field_validator("arch_list")
    @classmethod
    def _arch(cls, value: list[str]) -> list[str]:
        for arch in value:
            if not re.match(r"^\d+\.\d$", arch):
                raise ValueError(f"{arch!r} is not a compute capability like '8.0'")
        return value


class Xla(Strict):
    """PyTorch/XLA: the torch-xla release and the libtpu its `tpu` extra pins."""
    version: str
    libtpu: str

    _check = field_validator("version", "libtpu")(classmethod(lambda cls, v: _version(v)))


class Horovod(Strict):
    version: str
    frameworks: list[Literal["pytorch", "tensorflow", "mxnet"]] = Field(min_length=1)
    controllers: list[Literal["gloo", "mpi"]] = Field(min_length=1)
    cpu_operations: Literal["gloo", "mpi"]
    gpu_operations: Literal["nccl"] | None = None


class Verified(Strict):
    """How far the variant has been taken on a machine without GPUs, and what it measured."""
    how: Literal["ci", "built"]                 # ci: built and smoke-tested by every CI run; built: here, once
    date: dt.date                               # when it was built and measured
    build_minutes: float | None = Field(gt=0)   # wall time of a build from a cold start; null: not measured
    size_gb: float = Field(gt=0)                # the image's size (docker image inspect: Size / 1e9)


class Variant(Strict):
    name: str
    description: str
    distro: Literal["bookworm", "trixie"]
    python: str
    accelerator: Literal["cpu", "cuda", "tpu"]
    cuda: Cuda | None = None
    pytorch: PyTorch | None = None
    xla: Xla | None = None
    tensorflow: TensorFlow | None = None
    mxnet: MXNet | None = None
    horovod: Horovod | None = None
    mpi4py: str | None = None
    aliases: list[str] = []
    size_budget_gb: float = Field(gt=0)
    verified: Verified
    # Companions pinned above but left out of this build (`build.py build --without`), e.g.
    # where PyTorch's CPU torchvision cannot be reached; the labels and manifest say so.
    without: list[Literal["torchvision", "torchaudio"]] = []

    # ---- what the image carries, derived once here so nobody re-derives it ----
    def frameworks(self) -> list[str]:
        """Frameworks the entrypoint may be asked for (FRAMEWORK=...)."""
        names = []
        if self.pytorch:
            names.append("pytorch")
        if self.tensorflow:
            names += ["tensorflow", "keras"]
        if self.mxnet:
            names.append("mxnet")
        return names

    def compiles_wheels(self) -> bool:
        """Whether the builder stage compiles anything (Horovod, mpi4py) for the runtime."""
        return bool(self.horovod or self.mpi4py)

    def carries_cuda_wheels(self) -> bool:
        """torch's CUDA wheels (nvidia-*-cu12, triton) are installed: on a CUDA variant, and
        wherever torch is PyPI's wheel, a CUDA build (the tpu variant)."""
        return self.accelerator == "cuda" or (self.pytorch is not None
                                              and compat.local_tag(self.pytorch.version) is None)

    def horovod_frameworks(self) -> list[str]:
        return list(self.horovod.frameworks) if self.horovod else []

    def launchers(self) -> list[str]:
        """Launchers the entrypoint may use (LAUNCHER=...)."""
        names = ["native"]
        if self.horovod:
            names.append("horovod")
        if self.mpi4py or (self.horovod and "mpi" in self.horovod.controllers):
            names.append("mpi")
        return names

    def torch_companions(self) -> dict[str, str]:
        """torchvision/torchaudio pins this build installs (pinned and not left out)."""
        if not self.pytorch:
            return {}
        pins = {"torchvision": self.pytorch.torchvision, "torchaudio": self.pytorch.torchaudio}
        return {name: pin for name, pin in pins.items() if pin and name not in self.without}

    def leaving_out(self, names) -> "Variant":
        """This variant built without the named companions it pins (`build.py build --without`)."""
        dropped = {n for n in names if self.pytorch and getattr(self.pytorch, n, None)} | set(self.without)
        return self.model_copy(update={"without": sorted(dropped)}) if dropped != set(self.without) else self

    def base_image(self) -> str:
        return f"debian:{self.distro}-slim"

    def keras(self) -> str | None:
        if not self.tensorflow:
            return None
        return self.tensorflow.keras or compat.TENSORFLOW[compat.minor(self.tensorflow.version)].keras


class Matrix(BaseModel):
    model_config = ConfigDict(frozen=True)
    repository: str
    variants: dict[str, Variant]

    def select(self, names: list[str] | None) -> list[Variant]:
        if not names:
            return list(self.variants.values())
        unknown = [n for n in names if n not in self.variants]
        if unknown:
            raise MatrixError(f"unknown variant {unknown[0]!r}; allowed: {', '.join(self.variants)}")
        return [self.variants[n] for n in names]

    def cuda_variants(self) -> dict[str, str]:
        """Every CUDA variant's name and CUDA version (for the images' driver check)."""
        return {name: v.cuda.version for name, v in self.variants.items() if v.cuda}


# --------------------------------------------------------------------------- loading

def deep_merge(base: dict, override: dict) -> dict:
    """Mappings merge key by key; anything else in `override` replaces."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _owner_model(path: tuple) -> type[BaseModel] | None:
    """The pydantic model whose field is the last string in `path` (list indexes skipped)."""
    model: Any = Variant
    for part in [p for p in path if isinstance(p, str)][:-1]:
        field = model.model_fields.get(part)
        if field is None:
            return None
        candidates = get_args(field.annotation) or (field.annotation,)
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model


def _type_name(annotation) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(annotation))
    if origin is list:
        return "a list of " + _type_name(get_args(annotation)[0]).removeprefix("a ")
    args = [a for a in get_args(annotation) if a is not type(None)]
    if args:
        nullable = " or null" if type(None) in get_args(annotation) else ""
        return " or ".join(_type_name(a) for a in args) + nullable
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a mapping of " + ", ".join(annotation.model_fields)
    return {str: "a string", float: "a number", int: "an integer", bool: "true/false",
            dt.date: "a date (YYYY-MM-DD)"}.get(annotation, str(annotation))


def _describe(error: dict) -> tuple[str, str]:
    """One pydantic error -> (dotted field, message with what is allowed)."""
    path = tuple(error["loc"])
    field = ".".join(str(p) for p in path) or "(variant)"
    kind = error["type"]
    if kind == "extra_forbidden":
        owner = _owner_model(path)
        allowed = ", ".join(f for f in owner.model_fields if f != "name") if owner else "?"
        return field, f"unknown key; allowed: {allowed}"
    if kind == "missing":
        return field, "is required"
    annotation = None
    owner = _owner_model(path)
    names = [p for p in path if isinstance(p, str)]
    if owner is not None and names and names[-1] in owner.model_fields:
        annotation = owner.model_fields[names[-1]].annotation
        if isinstance(path[-1], int) and get_origin(annotation) is list:
            annotation = get_args(annotation)[0]
    allowed = f"; allowed: {_type_name(annotation)}" if annotation is not None else ""
    message = error["msg"].removeprefix("Value error, ")
    return field, f"{error.get('input')!r}: {message}{allowed}"


def build_variant(name: str, data: Any, defaults: dict, source: str) -> Variant:
    if not isinstance(data, dict):
        raise MatrixError(f"{source}: variant {name!r}: must be a mapping, got {type(data).__name__}")
    if not NAME_RE.match(name):
        raise MatrixError(f"{source}: variant {name!r}: name must match {NAME_RE.pattern}")
    merged = deep_merge(defaults, data)
    try:
        variant = Variant.model_validate({"name": name, **merged})
    except ValidationError as exc:
        field, message = _describe(exc.errors()[0])
        raise MatrixError(f"{source}: variant {name!r}: field {field!r}: {message}") from None
    if variant.accelerator == "cuda" and variant.cuda is None:
        raise MatrixError(f"{source}: variant {name!r}: field 'cuda': is required when accelerator is 'cuda'")
    if variant.accelerator != "cuda" and variant.cuda is not None:
        raise MatrixError(f"{source}: variant {name!r}: field 'cuda': must be absent when accelerator is "
                          f"{variant.accelerator!r}; allowed: accelerator 'cuda'")
    if variant.verified.size_gb > variant.size_budget_gb:
        raise MatrixError(f"{source}: variant {name!r}: field 'verified.size_gb': {variant.verified.size_gb} is "
                          f"over size_budget_gb {variant.size_budget_gb}; allowed: <= {variant.size_budget_gb}")
    if not variant.pytorch and not variant.tensorflow and not variant.mxnet:
        raise MatrixError(f"{source}: variant {name!r}: field 'pytorch': a variant needs pytorch, tensorflow "
                          f"and/or mxnet")
    problems = compat.check_variant(variant)
    if problems:
        field, message = problems[0]
        raise MatrixError(f"{source}: variant {name!r}: field {field!r}: {message}")
    return variant


def parse_matrix(data: Any, source: str = "matrix.yaml") -> Matrix:
    if not isinstance(data, dict):
        raise MatrixError(f"{source}: top level must be a mapping with repository, defaults, variants")
    allowed_top = {"repository", "defaults", "variants"}
    for key in data:
        if key not in allowed_top:
            raise MatrixError(f"{source}: unknown top-level key {key!r}; allowed: {', '.join(sorted(allowed_top))}")
    repository = data.get("repository")
    if not isinstance(repository, str) or not repository:
        raise MatrixError(f"{source}: field 'repository': {repository!r}: must be an image repository name")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise MatrixError(f"{source}: field 'defaults': must be a mapping")
    variants = data.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise MatrixError(f"{source}: field 'variants': must be a non-empty mapping of name -> variant")
    built = {name: build_variant(name, body, defaults, source) for name, body in variants.items()}
    aliases: dict[str, str] = {}
    for variant in built.values():
        for alias in variant.aliases:
            if alias in built or alias in aliases:
                raise MatrixError(f"{source}: variant {variant.name!r}: field 'aliases': {alias!r} is already "
                                  f"the name or alias of variant {aliases.get(alias, alias)!r}")
            aliases[alias] = variant.name
    return Matrix(repository=repository, variants=built)


def load_matrix(path: str | Path) -> Matrix:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise MatrixError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_matrix(data, source=path.name)
