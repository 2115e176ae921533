"""The warnings of a compiled instance: hypotheses of different classes (decision instances:
sharing no acceptable decision) that no test can tell apart. Legal, but worth saying
(docs/instances.md, *Legal but worth knowing*)."""

from __future__ import annotations

import numpy as np

from .compiled import CompiledInstance


def instance_warnings(inst: CompiledInstance, rows: np.ndarray | None = None) -> list[str]:
    """Hypotheses of different classes (decision instances: sharing no acceptable decision)
    that no test can tell apart (legal, but worth saying).
    ``rows``: a smaller array whose rows are equal exactly when the hypotheses' are."""
    if rows is None and inst.packed_outcomes is not None:
        rows = inst.packed_outcomes  # equal exactly when the 0/1 rows are, and 8× smaller
    if rows is None:
        # The outcome-major storage as rows (a view), rounded into one copy: equal rows are
        # equal in any fixed order of their cells. In place + 0.0: no −0.0.
        rows = inst.outcomes
        if rows is None:
            rows = np.round(inst.likelihood_by_outcome.reshape(inst.n_hypotheses, -1), 12)
            rows += 0.0
    group = _equal_row_groups(rows)
    if inst.is_decision:
        return _decision_warnings(inst, group)
    # Groups holding more than one class: sort by (group, class) and look for changes inside groups.
    order = np.lexsort((inst.class_index, group))
    g, c = group[order], inst.class_index[order]
    mixed = np.unique(g[1:][(g[1:] == g[:-1]) & (c[1:] != c[:-1])])
    # In the order of each group's first hypothesis, whatever array the rows were compared in.
    first = np.full(group.max(initial=0) + 1, inst.n_hypotheses)
    np.minimum.at(first, group, np.arange(inst.n_hypotheses))
    mixed = mixed[np.argsort(first[mixed], kind="stable")]
    messages = []
    for gid in mixed[:10]:
        members = np.flatnonzero(group == gid)
        names = ", ".join(f"'{inst.hypothesis_ids[i]}' ({inst.class_labels[inst.class_index[i]]})"
                          for i in members[:5])
        messages.append(f"indistinguishable: no test tells apart {names}")
    if len(mixed) > 10:
        messages.append(f"... and {len(mixed) - 10} more groups of indistinguishable hypotheses")
    return messages


def _equal_row_groups(rows: np.ndarray) -> np.ndarray:
    """A group number per row; rows in one group are byte-for-byte equal.

    Linear time, unlike ``np.unique(axis=0)``'s lexicographic sort of whole rows (seconds at
    10⁴ × 10³): each row's bytes, as 64-bit words, are hashed with fixed random odd multipliers
    (Σ w_j·x_j mod 2⁶⁴); rows are sorted by hash and neighbours with equal hashes are compared in
    full. A hash collision between different rows can only split a group (miss a warning),
    never merge different rows."""
    n = rows.shape[0]
    raw = np.ascontiguousarray(rows).view(np.uint8).reshape(n, -1)
    width = -(-raw.shape[1] // 8) * 8
    if width != raw.shape[1]:
        raw = np.pad(raw, ((0, 0), (0, width - raw.shape[1])))
    words = raw.view("<u8")
    rng = np.random.default_rng(0x5EED)
    multipliers = rng.integers(1, 2**63, size=words.shape[1], dtype=np.uint64) | 1
    digest = words @ multipliers  # wraps around mod 2⁶⁴; no n × m product held
    # A product mod 2⁶⁴ keeps only the low bits of a word's high ones, and a float's telling bits
    # are its high ones (0.25 and 0.75 end in 51 zero bits: their rows all collided, and the full
    # comparison of the candidates held three copies): the 32-bit halves are hashed too, mod 2³².
    halves = raw.view("<u4")
    half_multipliers = rng.integers(1, 2**31, size=halves.shape[1], dtype=np.uint32) | 1
    digest ^= (halves @ half_multipliers).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    order = np.argsort(digest, kind="stable")
    sorted_digest = digest[order]
    candidates = np.flatnonzero(sorted_digest[1:] == sorted_digest[:-1])
    equal = (raw[order[candidates + 1]] == raw[order[candidates]]).all(axis=1)
    starts = np.ones(n, dtype=bool)
    starts[candidates[equal] + 1] = False
    group = np.empty(n, dtype=np.intp)
    group[order] = np.cumsum(starts) - 1
    return group


def _decision_warnings(inst: CompiledInstance, group: np.ndarray) -> list[str]:
    # One sort by group, then every group's rows ANDed at once: a loop over the groups that
    # scanned every row for each was quadratic (10 s of CPU at 10⁵ hypotheses).
    order = np.argsort(group, kind="stable")  # groups ascending, members in their order
    sorted_group = group[order]
    starts = np.flatnonzero(np.r_[True, sorted_group[1:] != sorted_group[:-1]])
    sizes = np.diff(np.r_[starts, group.size])
    shared = np.logical_and.reduceat(inst.acceptable[order], starts, axis=0).any(axis=1)
    bad = np.flatnonzero((sizes > 1) & ~shared)
    bad = bad[np.argsort(order[starts[bad]], kind="stable")]  # in the order of each group's first hypothesis
    messages = []
    for b in bad[:10]:
        members = order[starts[b]:starts[b] + sizes[b]]
        names = ", ".join(
            f"'{inst.hypothesis_ids[i]}' ({'/'.join(inst.decision_labels[d] for d in np.flatnonzero(inst.acceptable[i]))})"
            for i in members[:5])
        messages.append(f"indistinguishable: no test tells apart {names}, which share no acceptable decision")
    if len(bad) > 10:
        messages.append(f"... and {len(bad) - 10} more groups of indistinguishable hypotheses")
    return messages
