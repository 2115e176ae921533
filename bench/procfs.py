"""What /proc says of the benchmarks' server processes: their children and the CPU they spent."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) each process has used, from /proc; a gunicorn master's workers
    are listed afresh each time (a worker may have been recycled)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for pid in pids:
        for child in [pid, *children(pid)]:
            try:
                fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            used[child] = (int(fields[11]) + int(fields[12])) / ticks
    return used


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (any of its threads), still running."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def children_cpu_seconds(pid: int) -> float:
    """CPU of the children ``pid`` has waited for (cutime + cstime)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
