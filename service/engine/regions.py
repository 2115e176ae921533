"""Decision regions: what the decision policies (``hec``, ``direct``) read, and what a belief says
about the decisions (docs/decisions.md).

A decision instance gives, for each hypothesis h, the set of decisions acceptable for it; the
region R_d is the set of hypotheses that accept d, and regions may overlap. A run is *decided*
when one decision is acceptable to every surviving hypothesis.

Both objectives are functions of power sums of the masses over sets of hypotheses. With
a(h) = w(h)/M the normalised masses of the alive hypotheses and, per test t and outcome x,
a_x(h) = a(h)·P(X_t = x | h):

    q_j(A) = Σ_{h ∈ A} a(h)^j            now,
    q_j(A, t, x) = Σ_{h ∈ A} a_x(h)^j    after observing x on t,

for A = V and A = V ∩ R_S (R_S = ∩_{d ∈ S} R_d). Hypotheses are summed per *acceptance pattern*
(distinct row of the acceptance matrix) first, then each set is the sum of the patterns that
contain it: one pass over the alive cells per power, O(J·|V|·N·ℓ), never a list of (hyper)edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Rows of hypotheses per block when forming the one-hot (rows × N) outcome matrices.
_BLOCK_CELLS = 1 << 17


@dataclass(frozen=True, eq=False)
class PowerSums:
    """``now[r, j-1]`` = q_j(A_r) and ``after[r, j-1, t, x]`` = q_j(A_r, t, x) for the sets A_r
    the caller asked for; ``posterior`` says the instance has likelihoods (the objectives are then
    taken on the posterior, docs/decisions.md)."""

    now: np.ndarray  # (R, J)
    after: np.ndarray  # (R, J, N, ℓ)
    posterior: bool
    # One decision suits every survivor: decided exactly, from the acceptance matrix (the weights
    # left are then 0, which inclusion-exclusion would only reach up to round-off).
    decided: bool


def region_sets(inst, with_intersections: bool) -> np.ndarray:
    """Sets of decisions as rows (R × D bool): first the empty set (standing for all of V), then
    either every nonempty set some hypothesis accepts all of (HEC's inclusion-exclusion) or each
    single decision (DiRECt's regions)."""
    empty = np.zeros((1, inst.n_decisions), dtype=bool)
    rest = inst.decision_intersections[0] if with_intersections else np.eye(inst.n_decisions, dtype=bool)
    return np.concatenate((empty, rest))


def power_sums(belief, sets: np.ndarray, powers: int) -> PowerSums:
    """q_j for j = 1..``powers`` over V ∩ R_S for each row S of ``sets`` (see the module).

    Compiled decision instances keep each acceptance pattern's hypotheses in contiguous runs, so
    this walks the alive rows run by run: a run's (J, N, ℓ) sums by one GEMM per block of rows and
    outcome (on a view of the stored rows when no hypothesis in the block has died), then added to
    every set S its pattern contains. Memory O(R·J·N·ℓ) for R sets."""
    inst = belief.instance
    patterns, pattern_of = inst.acceptance_patterns
    deterministic = inst.outcomes is not None
    width, n_tests = inst.max_outcomes, inst.n_tests
    alive = belief.alive
    weight = belief.mass / belief.mass.sum()
    groups = pattern_of[alive]
    bounds = np.flatnonzero(np.diff(groups)) + 1
    starts, ends = np.concatenate(([0], bounds)), np.concatenate((bounds, [alive.size]))
    # contains[g, r]: pattern g accepts every decision of set r.
    contains = (patterns[:, None, :] | ~sets[None, :, :]).all(axis=2)
    exponents = np.arange(1, powers + 1)[:, None]
    now = np.zeros((len(sets), powers))
    after = np.zeros((len(sets), powers, n_tests, width))
    run_after = np.empty((powers, n_tests, width))
    # Deterministic blocks are compared one outcome at a time; likelihood blocks hold all ℓ.
    block_rows = max(1, _BLOCK_CELLS // (n_tests * (1 if deterministic else width)))
    for start, end in zip(starts.tolist(), ends.tolist()):
        run_after[:] = 0.0
        run_now = np.zeros(powers)
        for block in range(start, end, block_rows):
            stop = min(end, block + block_rows)
            first, last = int(alive[block]), int(alive[stop - 1])
            rows = slice(first, last + 1) if last - first == stop - block - 1 else alive[block:stop]
            scaled = weight[block:stop][None, :] ** exponents  # (J, rows): a(h)^j
            run_now += scaled.sum(axis=1)
            if deterministic:
                cells = inst.outcomes[rows]
                for x in range(width):
                    run_after[:, :, x] += scaled @ (cells == x)
            else:
                # (rows, ℓ·N): a GEMV per power on the stored outcome-major likelihoods.
                likelihood = inst.likelihood_by_outcome[rows].reshape(stop - block, width * n_tests)
                powered = likelihood
                for j in range(powers):
                    if j == 1:
                        powered = likelihood * likelihood
                    elif j:
                        np.multiply(powered, likelihood, out=powered)
                    run_after[j] += (scaled[j] @ powered).reshape(width, n_tests).T
        members = np.flatnonzero(contains[groups[start]])
        now[members] += run_now
        after[members] += run_after
    return PowerSums(now, after, posterior=not deterministic, decided=decided_by_all(belief))


def complete_homogeneous(sums: np.ndarray, k: int) -> np.ndarray:
    """h_k, the complete homogeneous symmetric polynomial of degree k of the masses, from their
    power sums (``sums[:, j-1]`` = q_j, any trailing shape) by Newton's identities
    m·h_m = Σ_{i=1..m} q_i h_{m-i}: every term is ≥ 0, so no cancellation."""
    h = [np.ones_like(sums[:, 0])]
    for m in range(1, k + 1):
        h.append(sum(sums[:, i - 1] * h[m - i] for i in range(1, m + 1)) / m)
    return h[k]


def hyperedge_weight(sums: np.ndarray, signs: np.ndarray, k: int) -> np.ndarray:
    """Total weight of HEC's hyperedges among the masses: multisets of k hypotheses that share
    no acceptable decision, weighted by the product of their masses. All multisets weigh
    h_k(V); those sharing a decision are counted by inclusion-exclusion over the sets S:
    W = h_k(V) − Σ_S (−1)^{|S|+1} h_k(V ∩ R_S). ``sums`` rows: V first, then the sets S."""
    h = complete_homogeneous(sums, k)
    weight = h[0] - np.tensordot(signs, h[1:], axes=1)
    return np.maximum(weight, 0.0)  # the alternating sum may leave −1e-17


def region_edge_weights(sums: np.ndarray) -> np.ndarray:
    """DiRECt's per-region edge weights: problem d's edges join distinct hypotheses not both in
    R_d, so w_d = ½[(q_1(V)² − q_2(V)) − (q_1(V∩R_d)² − q_2(V∩R_d))]. ``sums`` rows: V, then
    each region; returns (D, trailing...)."""
    pairs = 0.5 * (sums[:, 0] ** 2 - sums[:, 1])
    return np.maximum(pairs[0][None] - pairs[1:], 0.0)


# --- what a belief says about the decisions ----------------------------------------------------


def decision_posterior(belief) -> np.ndarray:
    """P(d acceptable | x_A) = Σ_{h ∈ R_d} P(h | x_A) for every decision d, (D,)."""
    inst = belief.instance
    weight = belief.mass / belief.mass.sum()
    return weight @ inst.acceptable[belief.alive]


def expected_loss(belief) -> np.ndarray | None:
    """E[loss(h, d) | x_A] for every decision d, or None when the instance gives no losses."""
    inst = belief.instance
    if inst.loss is None:
        return None
    weight = belief.mass / belief.mass.sum()
    return weight @ inst.loss[belief.alive]


def decided_by_all(belief) -> bool:
    """One decision is acceptable to every surviving hypothesis."""
    return bool(belief.instance.acceptable[belief.alive].all(axis=0).any())


def choose_decision(probability: np.ndarray, loss: np.ndarray | None) -> int:
    """The decision to report: with losses the Bayes decision (least expected loss; ties to the
    more probably acceptable, then the earliest), else the most probably acceptable (ties to the
    earliest)."""
    if loss is None:
        return int(np.flatnonzero(probability >= probability.max() - 1e-12)[0])
    tied = np.flatnonzero(loss <= loss.min() + 1e-12)
    likeliest = probability[tied] >= probability[tied].max() - 1e-12
    return int(tied[np.flatnonzero(likeliest)[0]])
