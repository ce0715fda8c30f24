"""Gradient synchronization strategies: what each framework and launcher honours. Pure.

One table, `SUPPORT`, says for each (framework, launcher) which gradient
compressions, whether accumulation, and which bucket (fusion) setting the image applies,
and through which of the framework's own mechanisms. The contract's rule refuses, in one
line, a value the job's framework cannot honour; the dry run and docs/gradient-sync.md
read the same table. disttrain/gradsync.py applies it inside the training processes, which
read the job's values (GradSync, defined beside it in disttrain/gradsync_settings.py) from
their environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.gradsync_settings import GradSync

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")


@dataclass(frozen=True)
class Support:
    compressions: tuple[str, ...]      # what GRAD_COMPRESSION allows
    accumulation: str | None           # the mechanism GRAD_ACCUMULATION uses; None: refused
    bucket: str | None                 # what GRAD_BUCKET_MB sets; None: refused
    mechanisms: dict[str, str]         # compression -> the framework's own name for it


_DDP = Support(
    compressions=("none", "fp16", "bf16", "powersgd"),
    accumulation="DDP's no_sync() on N-1 of every N micro-batches; the optimizer steps every N calls",
    bucket="DDP's bucket_cap_mb",
    mechanisms={"fp16": "DDP comm hook fp16_compress_hook", "bf16": "DDP comm hook bf16_compress_hook "
                "(bf16_compress_hook_on_gloo on Gloo: the same hook, past DDP's NCCL-only check)",
                "powersgd": "DDP comm hook powerSGD_hook (error feedback, warm start)"})
_HOROVOD_TORCH = Support(
    compressions=("none", "fp16"),
    accumulation="hvd.DistributedOptimizer(backward_passes_per_step=N); the optimizer steps every N calls",
    bucket="HOROVOD_FUSION_THRESHOLD",
    mechanisms={"fp16": "hvd.Compression.fp16 in hvd.DistributedOptimizer"})
_HOROVOD_KERAS = Support(
    compressions=("none", "fp16"),
    accumulation="hvd.DistributedOptimizer(backward_passes_per_step=N, average_aggregated_gradients=True)",
    bucket="HOROVOD_FUSION_THRESHOLD",
    mechanisms={"fp16": "hvd.Compression.fp16 in hvd.DistributedOptimizer and hvd.DistributedGradientTape"})
_HOROVOD_TF = Support(
    compressions=("none", "fp16"),
    accumulation=None,            # hvd.DistributedGradientTape has no backward_passes_per_step
    bucket="HOROVOD_FUSION_THRESHOLD",
    mechanisms=_HOROVOD_KERAS.mechanisms)
_NOTHING = Support(compressions=("none",), accumulation=None, bucket=None, mechanisms={})

# (framework, launcher) -> Support. PyTorch under mpirun (LAUNCHER=mpi) trains with DDP too.
SUPPORT: dict[tuple[str, str], Support] = {
    ("pytorch", "native"): _DDP,
    ("pytorch", "mpi"): _DDP,
    ("pytorch", "horovod"): _HOROVOD_TORCH,
    ("keras", "horovod"): _HOROVOD_KERAS,
    ("tensorflow", "horovod"): _HOROVOD_TF,
    ("keras", "native"): _NOTHING,
    ("tensorflow", "native"): _NOTHING,
    ("keras", "mpi"): _NOTHING,
    ("tensorflow", "mpi"): _NOTHING,
    ("mxnet", "native"): _NOTHING,
    ("mxnet", "horovod"): _NOTHING,
}


def support(framework: str, launcher: str) -> Support:
    return SUPPORT.get((framework, launcher), _NOTHING)


def refusal(sync: GradSync, framework: str, launcher: str, sync_mode: str) -> str | None:
    """The one line that refuses what this framework and launcher cannot honour, or None."""
    where = f"FRAMEWORK={framework} LAUNCHER={launcher}"
    can = support(framework, launcher)
    if sync.compression not in can.compressions:
        others = [f"{fam}/{lau}" for (fam, lau), s in SUPPORT.items() if sync.compression in s.compressions]
        return (f"GRAD_COMPRESSION={sync.compression!r}: not built for {where}; allowed: "
                + ", ".join(can.compressions) + (f" ({sync.compression}: " + ", ".join(others) + ")" if others else ""))
    if sync.accumulation > 1 and can.accumulation is None:
        return f"GRAD_ACCUMULATION={sync.accumulation}: not built for {where}; allowed: 1"
    if sync.bucket_mb is not None and can.bucket is None:
        return f"GRAD_BUCKET_MB={sync.bucket_mb}: not built for {where}; allowed: unset"
    if sync_mode == "async" and (sync.compression != "none" or sync.accumulation > 1):
        name, value = (("GRAD_COMPRESSION", sync.compression) if sync.compression != "none"
                       else ("GRAD_ACCUMULATION", str(sync.accumulation)))
        return (f"{name}={value!r}: SYNC_MODE=async owns DDP's communication hook (local SGD); "
                f"allowed with SYNC_MODE=async: " + ("none" if name == "GRAD_COMPRESSION" else "1"))
    return None


def on_accelerator(sync: GradSync, xla: bool) -> str | None:
    """The one line for what the job's accelerator cannot do, or None: DDP's hooks and
    buckets are not built for the xla process group. (bf16 runs on NCCL and on Gloo, whose
    all-reduce sums bfloat16 as well.)"""
    if xla and not sync.default:
        name, value, allowed = next(
            (n, v, a) for n, v, a in (("GRAD_COMPRESSION", sync.compression, "none"),
                                      ("GRAD_ACCUMULATION", str(sync.accumulation), "1"),
                                      ("GRAD_BUCKET_MB", str(sync.bucket_mb), "unset"))
            if v not in ("none", "1", "None"))
        return (f"{name}={value!r}: DDP's communication hooks and buckets are not built for the xla process "
                f"group; allowed on PyTorch/XLA: {allowed}")
    return None


def describe(sync: GradSync, framework: str, launcher: str) -> list[str]:
    """The dry run's lines: what is applied, by which mechanism."""
    can = support(framework, launcher)
    lines = []
    if sync.compression != "none":
        extra = (f" (rank {sync.powersgd_rank}, plain all-reduce for the first {sync.powersgd_warmup} steps)"
                 if sync.compression == "powersgd" else "")
        lines.append(f"gradient compression: {sync.compression}{extra}: {can.mechanisms[sync.compression]}")
    if sync.accumulation > 1:
        lines.append(f"gradient accumulation: {sync.accumulation} micro-batches per synchronization: "
                     + can.accumulation.replace("N-1", str(sync.accumulation - 1)).replace("N", str(sync.accumulation)))
    if sync.bucket_mb is not None:
        lines.append(f"gradient buckets: {sync.bucket_mb} MB: {can.bucket}")
    return lines


def table() -> str:
    """SUPPORT as the markdown table docs/gradient-sync.md carries (a unit test holds them equal)."""
    rows = ["| FRAMEWORK | LAUNCHER | GRAD_COMPRESSION | GRAD_ACCUMULATION | GRAD_BUCKET_MB |", "|---|---|---|---|---|"]
    for (framework, launcher), can in SUPPORT.items():
        compressions = ", ".join(f"`{c}`" for c in can.compressions)
        rows.append(f"| {framework} | {launcher} | {compressions} | {can.accumulation or 'not built'} | "
                    f"{can.bucket or 'not built'} |")
    return "\n".join(rows)
