"""The status file: the job as the deciding node sees it, written once a second by that
node's entrypoint (entrypoint/health/vigil.py) and printed by `disttrain status`. Its one
format, for both: the entrypoint imports this module, never the other way round.

The file is DISTTRAIN_STATUS, else disttrain-status.json in /dev/shm (or the temporary
folder): one per container, as there is one entrypoint per container.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

VAR = "DISTTRAIN_STATUS"


def default_path(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get(VAR):
        return env[VAR]
    root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(root, "disttrain-status.json")


def snapshot(role: str, node: int, ranks: list, heartbeat_ages: dict[int, float], behind: str | None,
             hang_timeout: int) -> dict:
    return {"written": time.time(), "role": role, "node": node, "hang_timeout": hang_timeout,
            "heartbeat_age": {str(k): round(v, 1) for k, v in heartbeat_ages.items()},
            "behind": behind, "ranks": [r.to_dict() for r in ranks]}


def write(path: str, status: dict) -> None:
    aside = path + ".tmp"
    try:
        with open(aside, "w") as f:
            json.dump(status, f)
        os.replace(aside, path)
    except OSError:
        pass


def read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.0f}"


def table(status: dict) -> list[str]:
    """The status as lines: a header, then one row per rank."""
    age = time.time() - status["written"]
    timeout = status["hang_timeout"]
    head = (f"job as node {status['node']} ({status['role']}) saw it {age:.0f}s ago; HANG_TIMEOUT="
            f"{timeout or 'off'}; behind: {status.get('behind') or 'nobody'}")
    rows = [head, f"{'node':>4} {'host':<16} {'hb age':>6} {'rank':>5} {'pid':>7} {'steps':>7} "
                  f"{'idle s':>7} {'step s':>7} {'own s':>7}  counts"]
    hb = status.get("heartbeat_age", {})
    for r in status["ranks"]:
        rank = "-" if r["rank"] is None else str(r["rank"])
        rows.append(f"{r['node']:>4} {r['host'][:16]:<16} {_seconds(hb.get(str(r['node']))):>6} {rank:>5} "
                    f"{r['pid']:>7} {r['steps']:>7} {_seconds(r['idle_s']):>7} {_seconds(r['step_time']):>7} "
                    f"{_seconds(r['compute_time']):>7}  {r['source']}")
    if not status["ranks"]:
        rows.append("(no rank has made its first step yet)")
    return rows
