"""The restricted method of exposure control (Revuelta & Ponsoda, 1998), on counts a caller keeps
across sessions: a test given in ``max_rate`` of the sessions so far or more is held back, so no
test goes to more than that share of them.

Which sessions get a test near its cap is first come, first served under the plain method. Here
a test given in :data:`RESERVE_SHARE` of its cap or more is also kept from sessions already
fairly sure of their class (largest class posterior at least :data:`RESERVE_CONFIDENCE`), so
what is left of it goes to the sessions still unsure, which it helps most. On the item-bank
bench this cuts the plain method's accuracy loss by about a third (docs/item-banks.md).

Neither rule ever ends a run: a test stays eligible while no other informative one is.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .belief import Belief

RESERVE_SHARE = Fraction(9, 10)
RESERVE_CONFIDENCE = 0.7


class Restriction(NamedTuple):
    """What the counts hold back at a step: (N,) bool each."""

    held_back: np.ndarray  # given in max_rate of the sessions or more
    reserved: np.ndarray  # given in RESERVE_SHARE · max_rate of them or more, not held back


def over_rate(given: np.ndarray, sessions: int, rate: float, share: Fraction = Fraction(1)) -> np.ndarray:
    """(N,) bool: the tests given in ``share`` · ``rate`` of the ``sessions`` or more (``given``:
    (N,) counts)."""
    if sessions <= 0:
        return np.zeros(given.shape, dtype=bool)
    # One rounding, of a quotient of whole numbers, compared with the rate as given: exact where
    # the shares are equal (3 / 10 rounds to 0.3, while 0.3 · 10 rounds above 3).
    return given * share.denominator / (sessions * share.numerator) >= rate


def restriction(given: np.ndarray, sessions: int, max_rate: float) -> Restriction:
    """The restriction after ``sessions`` sessions (the one asking included) gave ``given``."""
    held = over_rate(given, sessions, max_rate)
    return Restriction(held, over_rate(given, sessions, max_rate, RESERVE_SHARE) & ~held)


def restricted(belief: Belief, eligible: np.ndarray, informative: np.ndarray,
               restriction: Restriction) -> np.ndarray:
    """``eligible`` less what ``restriction`` keeps from this belief's session, each rule applied
    only while an ``informative`` eligible test is left."""
    kept = eligible & ~restriction.held_back
    if (kept & informative).any():
        eligible = kept
    if belief.class_posterior.max() >= RESERVE_CONFIDENCE:
        kept = eligible & ~restriction.reserved
        if (kept & informative).any():
            eligible = kept
    return eligible
