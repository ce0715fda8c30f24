#!/usr/bin/env python3
"""Before and after, in one session: the same benchmark sections for this checkout and
another (a clone of the commit before a change), taking turns run by run, so that a load
change on the machine hits both alike.

    python bench/compare.py --against ../before --only launch --only rendezvous --repeats 5

Each round runs `bench/run.py --repeats 1` in each checkout, one after the other (each
checkout's own benchmark code and entrypoint, the same Python), the order swapped every
round (before-after, after-before, ...), so that whatever the second run of a round gains
or loses from the first (a warm page cache, the first one's leftover work) falls on both
alike. Every row's figure is the median over the rounds, and its after/before is also taken
round by round (the paired ratio: both runs of a round saw the same machine), with the
middle half of those ratios (their interquartile range) as the noise. Prints a Markdown
table and writes compare.json and compare.png to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# section -> (the fields that name a row, the figures compared)
ROWS = {"launch": (("nproc", "name"), ("seconds",)),
        "rendezvous": (("path", "nodes"), ("seconds", "wall", "cpu"))}


def run_once(tree: Path, sections: list[str], out: Path) -> dict:
    cmd = [sys.executable, str(tree / "bench" / "run.py"), "--repeats", "1", "--out", str(out)]
    cmd += [arg for s in sections for arg in ("--only", s)]
    subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    return json.loads((out / "results.json").read_text())


def medians(results: list[dict], section: str) -> dict[tuple, dict[str, float]]:
    keys, figures = ROWS[section]
    found: dict[tuple, dict[str, list[float]]] = {}
    for result in results:
        for row in result.get(section, []):
            name = tuple(row[k] for k in keys)
            for figure in figures:
                if row.get(figure) == row.get(figure):          # not NaN: the run worked
                    found.setdefault(name, {}).setdefault(figure, []).append(row[figure])
    return {name: {f: statistics.median(v) for f, v in figs.items()} for name, figs in found.items()}


def paired(before_runs: list[dict], after_runs: list[dict], section: str) -> dict[tuple, dict[str, list[float]]]:
    """Per row and figure, after/before of each round where both runs worked."""
    keys, figures = ROWS[section]
    found: dict[tuple, dict[str, list[float]]] = {}
    for b_run, a_run in zip(before_runs, after_runs):
        b_rows = {tuple(r[k] for k in keys): r for r in b_run.get(section, [])}
        for row in a_run.get(section, []):
            name = tuple(row[k] for k in keys)
            for figure in figures:
                b, a = b_rows.get(name, {}).get(figure), row.get(figure)
                if b and a and b == b and a == a:                       # both present, not NaN
                    found.setdefault(name, {}).setdefault(figure, []).append(a / b)
    return found


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q2, q1, q3


def table(before: dict, after: dict, sections: list[str],
          pairs: dict | None = None) -> tuple[str, list[tuple[str, float]]]:
    """`pairs` (section -> paired()): adds each row's paired ratio and its interquartile range."""
    lines, ratios = [], []
    for section in sections:
        keys, figures = ROWS[section]
        lines += [f"### {section}", "", "| row | figure | before | after | after/before | paired (IQR) |",
                  "|---|---|---|---|---|---|"]
        for name, figs in before[section].items():
            for figure in figures:
                b, a = figs.get(figure), after[section].get(name, {}).get(figure)
                if b is None or a is None:
                    lines.append(f"| {' / '.join(map(str, name))} | {figure} | {b} | {a} | failed | |")
                    continue
                ratios.append((f"{section}: {' / '.join(map(str, name))} ({figure})", a / b))
                rounds = (pairs or {}).get(section, {}).get(name, {}).get(figure)
                pair = "{:.3f}× ({:.3f}–{:.3f})".format(*spread(rounds)) if rounds else ""
                lines.append(f"| {' / '.join(map(str, name))} | {figure} | {b:.3f} | {a:.3f} | {a / b:.3f}× | {pair} |")
        lines.append("")
    return "\n".join(lines), ratios


def plot(ratios: list[tuple[str, float]], path: Path, pairs: dict | None = None) -> None:
    """One bar per row and figure: the paired ratio's median with its interquartile range
    where the rounds give one (`pairs`, section -> paired()), and the ratio of the medians as a dot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rounds(name: str) -> list[float] | None:
        section, rest = name.split(": ", 1)
        row, figure = rest.rsplit(" (", 1)
        for key, figs in (pairs or {}).get(section, {}).items():
            if " / ".join(map(str, key)) == row:
                return figs.get(figure.rstrip(")"))
        return None

    names = [name for name, _ in ratios]
    spreads = [spread(r) if (r := rounds(name)) else None for name in names]
    middle = [s[0] if s else ratio for s, (_, ratio) in zip(spreads, ratios)]
    errors = [[m - s[1] if s else 0 for s, m in zip(spreads, middle)], [s[2] - m if s else 0 for s, m in zip(spreads, middle)]]
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(ratios) + 1.5))
    ax.barh(names, middle, xerr=errors, color="tab:blue", ecolor="gray", capsize=2, label="paired ratio, IQR")
    ax.plot([r for _, r in ratios], names, "k.", label="ratio of the medians")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.05, color="red", linewidth=0.8, linestyle="--")
    ax.set_xlim(0.8, 1.25)
    ax.set_xlabel("after / before")
    ax.legend(loc="lower right")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=True, type=Path, help="the other checkout (the 'before')")
    p.add_argument("--only", choices=sorted(ROWS), action="append", help="sections (default: launch, rendezvous)")
    p.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "compare")
    args = p.parse_args()
    sections = args.only or list(ROWS)
    trees = {"before": args.against.resolve(), "after": ROOT}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(args.repeats):
        order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]    # before first, then after first
        for label, tree in order:
            print(f"== round {i + 1}/{args.repeats}: {label} ({tree})", file=sys.stderr, flush=True)
            runs[label].append(run_once(tree, sections, args.out / label / str(i)))
    before = {s: medians(runs["before"], s) for s in sections}
    after = {s: medians(runs["after"], s) for s in sections}
    pairs = {s: paired(runs["before"], runs["after"], s) for s in sections}
    text, ratios = table(before, after, sections, pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps({"rounds": args.repeats, "ratios": ratios}, indent=2))
    plot(ratios, args.out / "compare.png", pairs)
    print(f"Medians of {args.repeats} rounds, before and after taking turns.\n\n{text}")
    print(f"wrote {args.out / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
