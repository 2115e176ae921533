"""Worked examples: generators of real problem instances for the engine and the service.

* :mod:`service.examples.lotteries` — the paper's section 5 study: which economic theory
  (Expected Value, Prospect Theory, Mean-Variance-Skewness, CRRA) explains a person's choices
  between lotteries.
"""
