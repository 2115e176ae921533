"""The table both in-process micro benchmarks print: each form's median CPU time per operation
and the median of its paired ratios to the shipped form (pairs taken in the same round)."""
from __future__ import annotations

import statistics


def print_paired(operation: str, times: dict[str, list[float]], base: str = "as shipped") -> None:
    print(f"{operation:<30} {'CPU µs':>8} {'× ' + base:>13}")
    for form, measured in times.items():
        ratio = statistics.median(t / b for t, b in zip(measured, times[base]))
        print(f"{form:<30} {1e6 * statistics.median(measured):8.1f} {ratio:13.3f}")
