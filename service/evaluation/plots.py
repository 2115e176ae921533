"""Pictures of an evaluation (matplotlib, Agg backend: no display needed).

:func:`comparison_plot` draws the expected cost of each policy as bars (with 95 % intervals when
Monte Carlo) and the exact optimum as a line; for likelihood instances a second panel shows the
accuracy of the MAP class against the number of tests run.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: a server or CI has no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .report import EvaluationReport  # noqa: E402

# One colour per policy name, the same in every picture (tab10 order).
POLICY_COLOURS = {
    "ec2": "tab:red", "effecxtive": "tab:orange", "gbs": "tab:blue", "infogain": "tab:green",
    "voi": "tab:purple", "uncertainty": "tab:brown", "random": "tab:gray", "hec": "tab:olive",
    "direct": "tab:pink",
}


def comparison_plot(report: EvaluationReport, path: Path | str, title: str | None = None) -> Path:
    path = Path(path)
    curves = [p for p in report.policies if p.accuracy_by_tests]
    panels = 2 if curves else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels + 1.0, 4.2), squeeze=False)
    _cost_bars(axes[0, 0], report)
    if curves:
        _accuracy_curves(axes[0, 1], curves)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _cost_bars(ax, report: EvaluationReport) -> None:
    names = [p.policy for p in report.policies]
    costs = np.array([p.expected_cost for p in report.policies])
    colours = [POLICY_COLOURS.get(n, "tab:cyan") for n in names]
    x = np.arange(len(names))
    errors = None
    if all(p.expected_cost_ci is not None for p in report.policies):
        errors = np.array([[c - p.expected_cost_ci[0], p.expected_cost_ci[1] - c]
                           for c, p in zip(costs, report.policies)]).T
    ax.bar(x, costs, color=colours, yerr=errors, capsize=4 if errors is not None else 0)
    for xi, p in zip(x, report.policies):
        top = p.expected_cost_ci[1] if p.expected_cost_ci is not None else p.expected_cost
        label = f"{p.expected_cost:.3g}"
        if p.ratio_to_optimum is not None:
            label += f"\n×{p.ratio_to_optimum:.2f}"
        ax.annotate(label, (xi, top), textcoords="offset points", xytext=(0, 3),
                    ha="center", va="bottom", fontsize=8)
    if report.optimum is not None:
        ax.axhline(report.optimum, color="black", linestyle="--", linewidth=1,
                   label=f"optimum {report.optimum:.3g}")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("expected cost")
    ax.set_ylim(0, max(costs.max(), report.optimum or 0) * 1.25)
    method = "exact" if report.policies and report.policies[0].method == "exact" else "Monte Carlo, 95 % CI"
    ax.set_title(f"expected cost per policy ({method})", fontsize=10)


def _accuracy_curves(ax, curves) -> None:
    for p in curves:
        accuracy = np.asarray(p.accuracy_by_tests)
        ax.plot(np.arange(accuracy.size), accuracy, marker="o", markersize=3,
                color=POLICY_COLOURS.get(p.policy, "tab:cyan"), label=p.policy)
    ax.set_xlabel("tests run (a stopped run keeps its answer)")
    ax.set_ylabel("accuracy of the MAP class")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("accuracy against number of tests", fontsize=10)
