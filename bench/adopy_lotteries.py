"""ADOpy (grid-based mutual information, Yang et al. 2021) on the lottery study's subjects.

Run by ``bench/repeatable.py --adopy PYTHON``, in an environment of its own (ADOpy 0.4.1 needs
``numpy<1.24``), so it imports nothing from edgecut: it reads the instance and the subjects from
an ``.npz`` written by repeatable.py (the instance, and the subjects this process runs: their
indices and true hypotheses) and writes, per answer model and subject, whether the MAP class is
the true one and its posterior probability after 0..answers answers, as JSON::

    PYTHON bench/adopy_lotteries.py subjects.npz results.json

The model: one parameter ``h``, the hypothesis index, on the grid 0..n−1 with the instance's
prior; one design ``t``, the question; one response ``y`` ∈ {0, 1}; log P(y | t, h) read from the
instance's likelihoods. ADOpy picks the design maximising the mutual information between the
response and ``h`` (not the class), and asks its best question again whenever it is still the
best. The answers come from the same coins as repeatable.py's (the same seeds and streams), so
the comparison is paired.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from adopy import Engine, Model, Task


def main(source: str, target: str) -> int:
    data = np.load(source)
    likelihood, class_index, prior = data["likelihood"], data["class_index"], data["prior"]
    hypotheses, subjects = data["hypotheses"], data["subjects"]
    seed, study, answers = int(data["seed"]), int(data["study"]), int(data["answers"])
    n, n_tests, _ = likelihood.shape
    log_likelihood = np.log(likelihood)

    task = Task(designs=["t"], responses=["y"], name="lotteries")

    def log_lik(t, h, y):
        return log_likelihood[h.astype(int), t.astype(int), y.astype(int)]

    model = Model(task=task, params=["h"], func=log_lik, name="theories")
    engine = Engine(task=task, model=model, grid_design={"t": np.arange(n_tests)},
                    grid_param={"h": np.arange(n)}, grid_response={"y": [0, 1]}, dtype=np.float64)
    engine.log_prior = np.log(prior)

    def score(hypothesis: int) -> tuple[int, float]:
        """Whether the MAP class is the true one, and its posterior probability."""
        class_posterior = np.bincount(class_index, weights=np.exp(engine.log_post))
        return int(np.argmax(class_posterior) == class_index[hypothesis]), float(class_posterior.max())

    results = {"persistent": [], "fresh": [], "choice_seconds": []}
    for model_name in ("persistent", "fresh"):
        for subject, hypothesis in zip(subjects.tolist(), hypotheses.tolist()):
            coins = np.random.default_rng([seed, study, subject, 7])
            fixed_coins = coins.random(n_tests)
            engine.reset()
            scores = [score(hypothesis)]
            for _ in range(answers):
                started = time.perf_counter()
                design = engine.get_design("optimal")
                results["choice_seconds"].append(time.perf_counter() - started)
                t = int(round(design["t"]))
                coin = fixed_coins[t] if model_name == "persistent" else coins.random()
                y = 0 if coin < likelihood[hypothesis, t, 0] else 1
                started = time.perf_counter()
                engine.update({"t": t}, {"y": y})  # also recomputes the mutual information
                results["choice_seconds"][-1] += time.perf_counter() - started
                scores.append(score(hypothesis))
            results[model_name].append(scores)
    with open(target, "w") as out:
        json.dump(results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
