"""GradSync: the gradient strategies a job asked for (GRAD_COMPRESSION, POWERSGD_RANK,
POWERSGD_WARMUP, GRAD_ACCUMULATION, GRAD_BUCKET_MB), as the entrypoint hands them to every
rank in its environment and as disttrain.gradsync reads them back there. Pure.

What each framework honours, and the one-line refusals, are the entrypoint's contract
(entrypoint/contract/grad_sync.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class GradSync:
    """The strategies a job asked for (the contract's values)."""
    compression: str = "none"
    powersgd_rank: int = 4
    powersgd_warmup: int = 10
    accumulation: int = 1
    bucket_mb: int | None = None

    @classmethod
    def from_values(cls, v: Mapping[str, object]) -> "GradSync":
        """From the contract's parsed values, keyed by variable."""
        return cls(v["GRAD_COMPRESSION"], v["POWERSGD_RANK"], v["POWERSGD_WARMUP"], v["GRAD_ACCUMULATION"],
                   v["GRAD_BUCKET_MB"])

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "GradSync":
        """What `env()` wrote, read back in a training process; an unset variable keeps its
        default. ValueError (naming the variable) for a value that is not a whole number."""
        def number(name: str, default: int | None) -> int | None:
            text = (env.get(name) or "").strip()
            try:
                return int(text) if text else default
            except ValueError:
                raise ValueError(f"{name}={text!r} is not a whole number") from None

        d = cls()
        return cls((env.get("GRAD_COMPRESSION") or "").strip() or d.compression,
                   number("POWERSGD_RANK", d.powersgd_rank), number("POWERSGD_WARMUP", d.powersgd_warmup),
                   number("GRAD_ACCUMULATION", d.accumulation), number("GRAD_BUCKET_MB", d.bucket_mb))

    @property
    def default(self) -> bool:
        return self.compression == "none" and self.accumulation == 1 and self.bucket_mb is None

    def env(self) -> dict[str, str]:
        """What the training processes read (disttrain.gradsync)."""
        env = {"GRAD_COMPRESSION": self.compression, "GRAD_ACCUMULATION": str(self.accumulation)}
        if self.compression == "powersgd":
            env.update(POWERSGD_RANK=str(self.powersgd_rank), POWERSGD_WARMUP=str(self.powersgd_warmup))
        if self.bucket_mb is not None:
            env["GRAD_BUCKET_MB"] = str(self.bucket_mb)
        return env
