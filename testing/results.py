"""What the bundled examples print, parsed: RESULT lines (one per rank, at the end) and the
elastic jobs' rounds and membership changes; `check_trained` says what "it trained" means."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Two ranks' lines can arrive glued on one pipe: mpirun --tag-output ("...digest=ab[1,1]<stdout>:RESULT ..."),
# or a print under PYTHONUNBUFFERED=1 (the text and its newline are two writes: "...digest=abRESULT ...").
# The digest is hex, and a result's extra fields end at the next rank's tag or RESULT.
RESULT_RE = re.compile(r"RESULT framework=(\S+) rank=(\d+) world=(\d+) loss_before=([\d.]+) "
                       r"loss_after=([\d.]+) digest=([0-9a-f]+)((?:(?!\[\d+,\d+\]<std|RESULT ).)*)")

# Lines the elastic jobs write: the entrypoint's membership changes, rank 0's training rounds.
CHANGE_RE = re.compile(r"entrypoint: membership changed: world size (\d+) -> (\d+), resumed from step (\d+)")
ROUND_RE = re.compile(r"ROUND rank=0 world=(\d+) from_step=(\d+) loss=([\d.]+)")


@dataclass
class Result:
    framework: str
    rank: int
    world: int
    before: float
    after: float
    digest: str
    extra: str

    @property
    def fields(self) -> dict[str, str]:
        """The extra `key=value` fields after the digest."""
        return dict(kv.split("=", 1) for kv in self.extra.split() if "=" in kv)


def results(output: str) -> list[Result]:
    return [Result(m[1], int(m[2]), int(m[3]), float(m[4]), float(m[5]), m[6], m[7].strip())
            for m in RESULT_RE.finditer(output)]


def check_trained(output: str, world: int, agree: bool = True) -> list[Result]:
    """Every rank of a `world`-rank job printed its result, the loss fell by half or more,
    and (`agree`: synchronous training) the replicas' parameters are identical."""
    found = results(output)
    assert sorted(r.rank for r in found) == list(range(world)), output[-4000:]
    if agree:
        assert len({r.digest for r in found}) == 1, f"replicas disagree: {[(r.rank, r.digest) for r in found]}"
    for r in found:
        assert r.world == world
        assert r.after < 0.5 * r.before, f"loss did not go down: {r}"
    return found


def changes(output: str) -> list[tuple[int, int, int]]:
    return [(int(a), int(b), int(s)) for a, b, s in CHANGE_RE.findall(output)]


def initial_loss(output: str) -> float:
    first = [float(loss) for _, step, loss in ROUND_RE.findall(output) if step == "0"]
    assert first, output[-3000:]
    return first[0]
