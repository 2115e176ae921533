"""An evaluation report and a recommendation as text: aligned columns for a terminal, or pipe
tables for Markdown (docs/evaluation.md is made with them)."""

from __future__ import annotations

from service.engine import Recommendation

from .report import EvaluationReport


def format_tables(report: EvaluationReport, markdown: bool = False) -> str:
    """The report as text: one row per policy, then the mean cost per class. ``markdown`` gives
    pipe tables (docs/evaluation.md is made with it); otherwise aligned columns for a terminal."""
    decisions = any(p.expected_loss is not None for p in report.policies)
    item_bank = any(p.theta_rmse is not None for p in report.policies)
    lines = [_policy_table(report, decisions, item_bank, markdown),
             "\n".join(("- " if markdown else "  ") + f for f in _facts(report, decisions, item_bank))]
    classes = [c.label for c in report.policies[0].per_class] if report.policies else []
    class_header = ["mean cost per class"] + [
        f"{c.label} ({c.probability:.0%})" for c in report.policies[0].per_class] if classes else []
    class_rows = [[p.policy] + [f"{_num(c.mean_cost)} [{_num(c.min_cost)}–{_num(c.max_cost)}]"
                                for c in p.per_class] for p in report.policies]
    if classes:
        lines.append(_table(class_header, class_rows, markdown))
    return "\n\n".join(lines) + "\n"


def _policy_table(report: EvaluationReport, decisions: bool, item_bank: bool, markdown: bool) -> str:
    header = ["policy", "E[cost]", "E[tests]", "worst cost", "accuracy", "how runs end"]
    if item_bank:
        header[5:5] = ["θ RMSE", "top exposure"]
    if decisions:
        header.insert(5, "E[loss]")
    if report.optimum is not None:
        header.append("cost / OPT")
    rows = []
    for p in report.policies:
        cost = _num(p.expected_cost)
        if p.expected_cost_ci is not None:
            cost += f" ± {_num((p.expected_cost_ci[1] - p.expected_cost_ci[0]) / 2)}"
        accuracy = f"{p.accuracy:.1%}"
        if p.accuracy_ci is not None:
            accuracy += f" [{p.accuracy_ci[0]:.1%}, {p.accuracy_ci[1]:.1%}]"
        ends = ", ".join(f"{reason} {share:.1%}" for reason, share in p.stop_reasons.items())
        row = [p.policy, cost, _num(p.expected_tests), _num(p.worst_case_cost), accuracy, ends]
        if item_bank:
            row[5:5] = [f"{_num(p.theta_rmse)} [{_num(p.theta_rmse_ci[0])}, {_num(p.theta_rmse_ci[1])}]",
                        f"{p.top_exposure:.1%} ({p.top_exposure_item})"]
        if decisions:
            loss = _num(p.expected_loss)
            if p.expected_loss_ci is not None:
                loss += f" ± {_num((p.expected_loss_ci[1] - p.expected_loss_ci[0]) / 2)}"
            row.insert(5, loss)
        if report.optimum is not None:
            row.append(_num(p.ratio_to_optimum) if p.ratio_to_optimum is not None else "-")
        rows.append(row)
    return _table(header, rows, markdown)


def _facts(report: EvaluationReport, decisions: bool, item_bank: bool) -> list[str]:
    """What the numbers are: the instance, the method, the optimum, the stop rules."""
    monte_carlo = any(p.method == "monte_carlo" for p in report.policies)
    facts = [f"{report.instance_kind} instance: {report.n_hypotheses} hypotheses, "
             f"{report.n_classes} classes, {report.n_tests} tests; p_min = {report.p_min:.4g}"]
    if monte_carlo:
        samples = report.policies[0].samples
        facts.append(f"Monte Carlo, {samples} runs per policy, seed {report.seed}; ± is a 95 % interval")
    else:
        facts.append("exact: expected values from walking each policy's decision tree")
    if item_bank:
        facts.append("item bank: examinees are θ grid points drawn from the prior; θ RMSE of the EAP at the stop; "
                     "top exposure = share of examinees given the most-used item")
    if decisions:
        facts.append("accuracy = P(the decision at the stop is acceptable); E[loss] of that decision")
    if report.optimum is not None:
        what = " until a decision suits every hypothesis left" if decisions else ""
        facts.append(f"optimum OPT = {_num(report.optimum)} (dynamic programme{what})")
    elif report.optimum_note:
        facts.append(f"optimum: {report.optimum_note}")
    if report.ec2_bound is not None:
        facts.append(f"EC² guarantee: cost / OPT ≤ 2 ln(1/p_min) + 1 = {_num(report.ec2_bound)}")
    rules = {k: v for k, v in report.rules.items() if v is not None}
    if rules:
        facts.append("stop rules: " + ", ".join(f"{k} = {v}" for k, v in rules.items()))
    return facts


def format_recommendation(recommendation: Recommendation, markdown: bool = False) -> str:
    """``auto``'s ranking as text: one row per candidate, best first, then the pick and how much
    was simulated."""
    def interval(ci: tuple[float, float] | None, percent: bool) -> str:
        if ci is None:
            return ""
        low, high = (f"{x:.1%}" if percent else _num(x) for x in ci)
        return f" [{low}, {high}]"

    header = ["rank", "policy", "accuracy", "mean cost", "mean tests", "accuracy − pick's (paired)"]
    rows = []
    for rank, c in enumerate(recommendation.candidates, 1):
        accuracy = "-" if c.accuracy is None else f"{c.accuracy:.1%}" + interval(c.accuracy_ci, True)
        cost = _num(c.mean_cost) + interval(c.mean_cost_ci, False)
        gap = "-" if c.accuracy_gap is None else f"{c.accuracy_gap:+.1%}" + interval(c.accuracy_gap_ci, True)
        rows.append([str(rank), c.policy, accuracy, cost, _num(c.mean_tests), gap])
    facts = [f"auto → {recommendation.policy}",
             f"{recommendation.note} (seed {recommendation.seed}, {recommendation.cpu_seconds:.2f} s of CPU; "
             "[…] are 95 % intervals)"]
    return _table(header, rows, markdown) + "\n\n" + "\n".join(("- " if markdown else "  ") + f for f in facts) + "\n"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(out)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*row) for row in rows])
