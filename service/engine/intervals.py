"""95 % intervals of simulated means and proportions (Monte Carlo evaluation, ``auto``)."""

from __future__ import annotations

import math

import numpy as np

# Two-sided 95 % normal quantile.
Z_95 = 1.959963984540054


def mean_interval(values: np.ndarray) -> tuple[float, float]:
    """mean ± z·s/√R (s with R − 1 degrees of freedom); a single value: the value itself."""
    mean = float(values.mean())
    if values.size < 2:
        return (mean, mean)
    half = Z_95 * float(values.std(ddof=1)) / math.sqrt(values.size)
    return (mean - half, mean + half)


def wilson_interval(p: float, n: int) -> tuple[float, float]:
    """Wilson score interval: stays inside [0, 1] and is sensible at p = 0 or 1, unlike p ± z·se."""
    z2 = Z_95 * Z_95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))
