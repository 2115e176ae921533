"""The wire contract: every rejection names its place; the two forms compile alike; defaults,
noise models, max_flips expansion and the indistinguishable warning."""

from __future__ import annotations

import copy
import itertools
import math
import re
import typing
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from schemas.instance import Instance, json_path
from service import engine


def per_hypothesis():
    return {
        "tests": [
            {"id": "ecg", "cost": 2.0, "outcomes": ["normal", "abnormal"]},
            {"id": "trop", "cost": 1.0, "outcomes": ["low", "high"]},
        ],
        "hypotheses": [
            {"id": "mi", "class": "admit", "prior": 0.1, "outcomes": {"ecg": "abnormal", "trop": "high"}},
            {"id": "angina", "class": "admit", "prior": 0.3, "outcomes": {"ecg": "abnormal", "trop": "low"}},
            {"id": "reflux", "class": "home", "prior": 0.6, "outcomes": {"ecg": "normal", "trop": "low"}},
        ],
    }


def columnar():
    return {
        "tests": [
            {"id": "ecg", "cost": 2.0, "outcomes": ["normal", "abnormal"]},
            {"id": "trop", "cost": 1.0, "outcomes": ["low", "high"]},
        ],
        "matrix": [[1, 1], [1, 0], [0, 0]],
        "classes": ["admit", "admit", "home"],
        "priors": [0.1, 0.3, 0.6],
        "hypothesis_ids": ["mi", "angina", "reflux"],
    }


def noisy():
    return {
        "tests": [{"id": "ecg", "outcomes": ["normal", "abnormal"]}],
        "hypotheses": [
            {"id": "mi", "likelihoods": {"ecg": {"normal": 0.2, "abnormal": 0.8}}},
            {"id": "reflux", "likelihoods": {"ecg": {"normal": 0.9, "abnormal": 0.1}}},
        ],
    }


def noisy_columnar():
    return {
        "tests": [{"id": "ecg"}, {"id": "trop"}],
        "likelihood_matrix": [[[0.2, 0.8], [0.5, 0.5]], [[0.9, 0.1], [0.3, 0.7]]],
        "classes": ["a", "b"],
    }


def edit(base, change):
    payload = copy.deepcopy(base() if callable(base) else base)
    change(payload)
    return payload


def set_in(path, value):
    def change(payload):
        target = payload
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return change


REJECTIONS = {
    "duplicate test id": (edit(per_hypothesis, lambda p: p["tests"].append({"id": "ecg"})), "tests[2].id"),
    "duplicate hypothesis id": (
        edit(per_hypothesis, set_in(["hypotheses", 2, "id"], "mi")), "hypotheses[2].id"),
    "duplicate columnar hypothesis id": (
        edit(columnar, set_in(["hypothesis_ids", 1], "mi")), "hypothesis_ids[1]"),
    "unknown test id in outcomes": (
        edit(per_hypothesis, set_in(["hypotheses", 1, "outcomes", "xray"], "clear")), "hypotheses[1].outcomes.xray"),
    "unknown test id in likelihoods": (
        edit(noisy, set_in(["hypotheses", 1, "likelihoods", "xray"], {"a": 1.0})), "hypotheses[1].likelihoods.xray"),
    "label outside the test's outcomes": (
        edit(per_hypothesis, set_in(["hypotheses", 2, "outcomes", "ecg"], "weird")), "hypotheses[2].outcomes.ecg"),
    "likelihood label outside the test's outcomes": (
        edit(noisy, set_in(["hypotheses", 0, "likelihoods", "ecg"], {"normal": 0.2, "odd": 0.8})),
        "hypotheses[0].likelihoods.ecg.odd"),
    "matrix index outside the test's outcomes": (edit(columnar, set_in(["matrix", 2, 1], 2)), "matrix[2][1]"),
    "negative matrix index": (edit(columnar, set_in(["matrix", 0, 0], -1)), "matrix[0][0]"),
    "deterministic hypothesis missing a test": (
        edit(per_hypothesis, lambda p: p["hypotheses"][1]["outcomes"].pop("trop")), "hypotheses[1].outcomes.trop"),
    "negative prior": (edit(per_hypothesis, set_in(["hypotheses", 0, "prior"], -0.1)), "hypotheses[0].prior"),
    "infinite prior": (edit(per_hypothesis, set_in(["hypotheses", 1, "prior"], math.inf)), "hypotheses[1].prior"),
    "NaN prior": (edit(per_hypothesis, set_in(["hypotheses", 2, "prior"], math.nan)), "hypotheses[2].prior"),
    "negative columnar prior": (edit(columnar, set_in(["priors", 2], -1)), "priors[2]"),
    "NaN columnar prior": (edit(columnar, set_in(["priors", 1], math.nan)), "priors[1]"),
    "priors all zero": (
        edit(per_hypothesis, lambda p: [h.update(prior=0) for h in p["hypotheses"]]), "hypotheses"),
    "columnar priors all zero": (edit(columnar, set_in(["priors"], [0, 0.0, 0])), "priors"),
    "prior missing for one hypothesis": (
        edit(per_hypothesis, lambda p: p["hypotheses"][1].pop("prior")), "hypotheses[1].prior"),
    "zero cost": (edit(per_hypothesis, set_in(["tests", 1, "cost"], 0)), "tests[1].cost"),
    "negative cost": (edit(per_hypothesis, set_in(["tests", 0, "cost"], -2.0)), "tests[0].cost"),
    "infinite cost": (edit(per_hypothesis, set_in(["tests", 0, "cost"], math.inf)), "tests[0].cost"),
    "NaN cost": (edit(per_hypothesis, set_in(["tests", 1, "cost"], math.nan)), "tests[1].cost"),
    "likelihoods not summing to 1": (
        edit(noisy, set_in(["hypotheses", 1, "likelihoods", "ecg"], {"normal": 0.9, "abnormal": 0.2})),
        "hypotheses[1].likelihoods.ecg"),
    "likelihood row just outside 1e-6": (
        edit(noisy, set_in(["hypotheses", 0, "likelihoods", "ecg"], {"normal": 0.2, "abnormal": 0.8 + 2e-6})),
        "hypotheses[0].likelihoods.ecg"),
    "negative likelihood": (
        edit(noisy, set_in(["hypotheses", 0, "likelihoods", "ecg"], {"normal": -0.2, "abnormal": 1.2})),
        "hypotheses[0].likelihoods.ecg.normal"),
    "likelihood matrix cell not summing to 1": (
        edit(noisy_columnar, set_in(["likelihood_matrix", 1, 0], [0.5, 0.6])), "likelihood_matrix[1][0]"),
    "no tests": (edit(per_hypothesis, set_in(["tests"], [])), "tests"),
    "no hypotheses": (edit(per_hypothesis, set_in(["hypotheses"], [])), "hypotheses"),
    "no matrix rows": (
        edit(columnar, lambda p: p.update(matrix=[], classes=[], priors=None, hypothesis_ids=None)), "matrix"),
    "ragged matrix": (edit(columnar, set_in(["matrix", 1], [1])), "matrix[1]"),
    "ragged likelihood matrix (tests)": (
        edit(noisy_columnar, set_in(["likelihood_matrix", 0], [[0.2, 0.8]])), "likelihood_matrix[0]"),
    "ragged likelihood matrix (outcomes)": (
        edit(noisy_columnar, set_in(["likelihood_matrix", 1, 1], [0.2, 0.3, 0.5])), "likelihood_matrix[1][1]"),
    "classes of the wrong length": (edit(columnar, set_in(["classes"], ["admit", "home"])), "classes"),
    "duplicate outcome labels": (edit(per_hypothesis, set_in(["tests", 0, "outcomes"], ["normal", "normal"])),
                                 "tests[0].outcomes"),
    "error rate of 1": (edit(per_hypothesis, set_in(["tests", 1, "error_rate"], 1.0)), "tests[1].error_rate"),
    "a repeatable deterministic test": (edit(per_hypothesis, set_in(["tests", 0, "repeatable"], True)),
                                        "tests[0].repeatable"),
    "noise of 1": (edit(per_hypothesis, set_in(["noise"], 1)), "noise"),
    "max_flips past the number of tests": (edit(columnar, set_in(["max_flips"], 3)), "max_flips"),
    "an unknown skip cost": (edit(per_hypothesis, set_in(["skip_cost"], "sometimes")), "skip_cost"),
    "empty test text": (edit(per_hypothesis, set_in(["tests", 0, "text"], "")), "tests[0].text"),
    "an infinite prior mean of an item bank": (
        {"item_bank": {"items": [{"id": "q1", "model": "2PL", "a": 1.0, "b": 0.0}], "prior": {"mean": math.inf, "sd": 1}}},
        "item_bank.prior.mean"),
    "an empty content area of an item": (
        {"item_bank": {"items": [{"id": "q1", "model": "1PL", "b": 0.0, "content_area": ""}]}},
        "item_bank.items[0].content_area"),
    "text for an outcome the test lacks": (
        edit(per_hypothesis, set_in(["tests", 0, "outcome_text"], {"maybe": "Maybe"})), "tests[0].outcome_text.maybe"),
}


@pytest.mark.parametrize("payload,path", REJECTIONS.values(), ids=REJECTIONS.keys())
def test_every_rejection_names_its_place(payload, path):
    with pytest.raises(ValidationError) as refused:
        Instance.model_validate(payload)
    paths = [json_path(error["loc"]) for error in refused.value.errors()]
    assert path in paths, f"expected an error at {path}, got {paths}"


def wire_fields() -> dict[str, set[str]]:
    """The field names (as a client spells them) of the wire instance and of every model nested
    in it, by model."""
    from pydantic import BaseModel

    fields, pending = {}, [Instance]
    while pending:
        model = pending.pop()
        if model.__name__ in fields:
            continue
        fields[model.__name__] = {field.alias or name for name, field in model.model_fields.items()}
        for field in model.model_fields.values():
            annotations = [field.annotation]
            while annotations:
                annotation = annotations.pop()
                if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    pending.append(annotation)
                # list[X] | None, Annotated[Union[...], ...]: the models inside
                annotations.extend(typing.get_args(annotation))
    return fields


def test_every_field_of_the_wire_instance_has_a_rejection_naming_its_place():
    """A field added to the wire instance (a new form among them) fails here until a refusal of a
    bad value in it is in a catalogue of rejections, at its JSON path (docs/architecture.md:
    adding an instance form)."""
    from tests.test_big_instances import REFUSED
    from tests.test_decisions import REJECTIONS as DECISION_REJECTIONS
    from tests.test_item_banks import RULES as ITEM_BANK_RULES

    paths = [path for catalogue in (REJECTIONS, DECISION_REJECTIONS, REFUSED) for _, path in catalogue.values()]
    paths += [path for path, _ in ITEM_BANK_RULES]
    named = {part for path in paths for part in re.split(r"[.\[\]]+", path) if part and not part.isdigit()}
    top = {re.split(r"[.\[]", path)[0] for path in paths}
    fields = wire_fields()
    assert {"Instance", "TestSpec", "HypothesisSpec"} <= fields.keys()
    for model, names in fields.items():
        missing = names - (top if model == "Instance" else named)
        assert not missing, f"no rejection names {model}'s {sorted(missing)}"


def test_the_base_payloads_are_valid():
    # Otherwise every rejection above would pass for the wrong reason.
    for base in (per_hypothesis, columnar, noisy, noisy_columnar):
        Instance.model_validate(base())


def test_json_path_spells_locations_as_a_reader_writes_them():
    assert json_path(("hypotheses", 3, "outcomes", "ecg")) == "hypotheses[3].outcomes.ecg"
    assert json_path(("likelihood_matrix", 1, 0)) == "likelihood_matrix[1][0]"


# --- the two forms, labels and defaults ---------------------------------------------------------


def compile_payload(payload, **options):
    return engine.compile_instance(Instance.model_validate(payload), **options)


def test_both_forms_compile_to_the_same_arrays_and_hash():
    rows = compile_payload(per_hypothesis())
    cols = compile_payload(columnar())
    assert rows.hypothesis_ids == cols.hypothesis_ids == ("mi", "angina", "reflux")
    assert rows.outcome_labels == cols.outcome_labels
    assert np.array_equal(rows.outcomes, cols.outcomes) and rows.outcomes.dtype == cols.outcomes.dtype
    assert np.array_equal(rows.prior, cols.prior) and np.array_equal(rows.costs, cols.costs)
    assert np.array_equal(rows.class_index, cols.class_index) and rows.class_labels == cols.class_labels
    assert rows.content_hash == cols.content_hash
    # The hash is of the content: a different prior is a different instance.
    changed = edit(columnar, set_in(["priors", 0], 0.2))
    assert compile_payload(changed).content_hash != cols.content_hash


def likelihood_rows():
    return {
        "tests": [{"id": "ecg", "outcomes": ["0", "1"]}, {"id": "trop", "outcomes": ["0", "1"]}],
        "hypotheses": [
            {"id": "0", "class": "a", "likelihoods": {"ecg": {"0": 0.2, "1": 0.8}, "trop": {"0": 0.5, "1": 0.5}}},
            {"id": "1", "class": "b", "likelihoods": {"ecg": {"0": 0.9, "1": 0.1}, "trop": {"0": 0.3, "1": 0.7}}},
        ],
    }


# One instance spelt in two forms: both compile to the same content hash (the hash is over the
# compiled arrays and labels, so equal hashes are equal instances).
SPELLINGS = {"columnar": (per_hypothesis, columnar), "likelihood columnar": (likelihood_rows, noisy_columnar)}
# Fields that qualify an instance in any form rather than spell its hypotheses: the noise model,
# what a skip costs, and decisions (their forms: tests/test_decisions.py).
OPTIONS = {"noise", "max_flips", "skip_cost", "decisions", "loss_tolerance", "acceptable_matrix", "loss_matrix"}
# Forms that make their hypotheses from a model, which no other form spells (an item bank's θ
# grid is part of its id): the test comparing what they compile to with the model's formulas.
MODELS = {"item_bank": "tests/test_item_banks.py::test_likelihoods_are_the_irt_probabilities_at_each_grid_point"}


@pytest.mark.parametrize("name", SPELLINGS)
def test_every_form_compiles_to_the_instance_its_per_hypothesis_spelling_does(name):
    rows, other = (compile_payload(spell()) for spell in SPELLINGS[name])
    assert rows.content_hash == other.content_hash and rows.hypothesis_ids == other.hypothesis_ids


def test_every_field_of_the_wire_instance_is_in_a_compared_form_or_an_option():
    """A new form's fields fail here until SPELLINGS holds the form beside its per-hypothesis
    spelling, or MODELS names the test of what it compiles to (docs/architecture.md: adding an
    instance form)."""
    spelt = {name for pair in SPELLINGS.values() for spell in pair for name in spell()}
    missing = wire_fields()["Instance"] - spelt - OPTIONS - MODELS.keys()
    assert not missing, f"no form in SPELLINGS uses {sorted(missing)}"
    root = Path(__file__).resolve().parent.parent
    for reference in MODELS.values():
        file, test = reference.split("::")
        assert re.search(rf"^def {test}\(", (root / file).read_text(), re.M), f"{reference} is not a test"


def test_every_field_of_the_wire_instance_is_in_the_docs():
    """docs/instances.md, or the page of the form (docs/decisions.md, …), names every field."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    text = "".join(page.read_text() for page in sorted(docs.glob("*.md")) if page.name != "architecture.md")
    for model, names in wire_fields().items():
        # Named in code: "name", or inside a code span such as `name` or `{grid, weights}`.
        in_code = {word for span in re.findall(r"`([^`\n]+)`", text) for word in re.findall(r"\w+", span)}
        undocumented = {name for name in names if f'"{name}"' not in text and name not in in_code}
        assert not undocumented, f"no page of docs/ names {model}'s {sorted(undocumented)}"


def test_the_hash_of_binary_answers_sees_every_cell():
    # Answers of two outcomes are hashed as packed bits (rows padded to whole bytes): every cell
    # must still count, the padding must not, and equal answers must hash equal.
    rng = np.random.default_rng(11)
    matrix = rng.integers(0, 2, size=(6, 11))  # 11 columns: 5 padding bits per row
    payload = {"tests": [{"id": f"t{j}", "outcomes": ["no", "yes"]} for j in range(11)],
               "classes": ["a", "b", "a", "c", "b", "c"]}
    base = compile_payload({**payload, "matrix": matrix.tolist()})
    assert base.packed_outcomes is not None
    assert compile_payload({**payload, "matrix": matrix.tolist()}).content_hash == base.content_hash
    hashes = {base.content_hash}
    for i, j in itertools.product(range(6), range(11)):
        flipped = matrix.copy()
        flipped[i, j] ^= 1
        hashes.add(compile_payload({**payload, "matrix": flipped.tolist()}).content_hash)
    assert len(hashes) == 1 + 6 * 11
    # The same cells with a third outcome the answers never use: stored unpacked, another id.
    wider = {**payload, "tests": [{"id": f"t{j}", "outcomes": ["no", "yes", "maybe"]} for j in range(11)]}
    assert compile_payload({**wider, "matrix": matrix.tolist()}).content_hash not in hashes


def test_both_likelihood_forms_compile_to_the_same_tensor_and_hash():
    a, b = compile_payload(likelihood_rows()), compile_payload(noisy_columnar())
    assert np.array_equal(a.likelihood, b.likelihood) and a.content_hash == b.content_hash
    assert b.likelihood[1, 1, 1] == pytest.approx(0.7)


def test_the_compiled_matrix_uses_the_smallest_unsigned_dtype():
    assert compile_payload(columnar()).outcomes.dtype == np.uint8
    wide = {"tests": [{"id": "t"}], "matrix": [[300], [0]], "classes": ["a", "b"]}
    assert compile_payload(wide).outcomes.dtype == np.uint16


def test_hypotheses_are_stored_grouped_by_class_keeping_their_order():
    payload = edit(per_hypothesis, lambda p: p["hypotheses"].insert(1, p["hypotheses"].pop(2)))
    inst = compile_payload(payload)  # given order: mi (admit), reflux (home), angina (admit)
    assert inst.hypothesis_ids == ("mi", "angina", "reflux")
    assert list(inst.class_index) == [0, 0, 1]


def test_integer_labels_are_accepted_as_decimal_strings():
    payload = {
        "tests": [{"id": 7, "outcomes": [0, 1, 10]}],
        "hypotheses": [{"id": 1, "class": 2, "outcomes": {"7": 10}}, {"id": 2, "outcomes": {"7": 0}}],
    }
    inst = compile_payload(payload)
    assert inst.test_ids == ("7",) and inst.outcome_labels == (("0", "1", "10"),)
    assert set(inst.hypothesis_ids) == {"1", "2"} and set(inst.class_labels) == {"2"}
    assert inst.outcomes[inst.hypothesis_ids.index("1"), 0] == 2
    # Booleans are not integers to a user.
    with pytest.raises(ValidationError):
        Instance.model_validate({"tests": [{"id": True}], "hypotheses": [{"id": "x", "outcomes": {"True": "a"}}]})
    # The lists of labels of the columnar form, too: integers become strings, a boolean is named.
    columnar = {"tests": [{"id": "t", "outcomes": [0, 1]}], "classes": [5, "b", 5], "hypothesis_ids": [10, 11, 12],
                "matrix": [[0], [1], [1]]}
    inst = compile_payload(columnar)
    assert inst.class_labels == ("5", "b") and set(inst.hypothesis_ids) == {"10", "11", "12"}
    with pytest.raises(ValidationError) as refused:
        Instance.model_validate({**columnar, "classes": [5, True, "b"]})
    assert [error["loc"] for error in refused.value.errors()] == [("classes", 1)]


def test_defaults_class_is_the_id_prior_uniform_cost_1_outcomes_sorted():
    payload = {
        "tests": [{"id": "colour"}],
        "hypotheses": [
            {"id": "x", "outcomes": {"colour": "red"}},
            {"id": "y", "outcomes": {"colour": "blue"}},
            {"id": "z", "outcomes": {"colour": "green"}},
        ],
    }
    inst = compile_payload(payload)
    assert inst.class_labels == ("x", "y", "z")  # plain identification: each hypothesis its own class
    assert np.array_equal(inst.prior, np.full(3, 1 / 3))
    assert list(inst.costs) == [1.0]
    assert inst.outcome_labels == (("blue", "green", "red"),)
    assert list(inst.outcomes[:, 0]) == [2, 0, 1]


def test_given_priors_are_normalised():
    payload = edit(per_hypothesis, lambda p: [h.update(prior=10 * h["prior"]) for h in p["hypotheses"]])
    assert compile_payload(payload).prior == pytest.approx([0.1, 0.3, 0.6], rel=1e-15)


# --- noise -----------------------------------------------------------------------------------


def test_noise_gives_symmetric_likelihoods():
    payload = {
        "tests": [{"id": "t", "outcomes": ["a", "b", "c"]}, {"id": "u", "outcomes": ["x", "y"], "error_rate": 0.1}],
        "hypotheses": [{"id": "h", "outcomes": {"t": "b", "u": "x"}}, {"id": "g", "outcomes": {"t": "a", "u": "y"}}],
        "noise": 0.3,
    }
    inst = compile_payload(payload)
    assert inst.kind == "likelihood" and inst.outcomes is None
    h = inst.hypothesis_ids.index("h")
    # P(stated) = 1 - ε; the other ℓ - 1 outcomes share ε. The per-test error_rate wins over noise.
    assert inst.likelihood[h, 0, :3] == pytest.approx([0.15, 0.7, 0.15])
    assert inst.likelihood[h, 1, :2] == pytest.approx([0.9, 0.1])
    assert inst.likelihood[h, 1, 2] == 0.0  # u has two outcomes; the padding column stays empty
    assert engine.default_policy(inst) == engine.DEFAULT_POLICIES["likelihood"]


def test_a_zero_noise_rate_keeps_the_instance_deterministic():
    assert compile_payload(edit(per_hypothesis, lambda p: p.update(noise=0))).kind == "deterministic"


def test_noise_on_given_likelihoods_is_refused():
    with pytest.raises(ValidationError) as refused:
        Instance.model_validate(edit(noisy, lambda p: p.update(noise=0.1)))
    assert "noise" in [json_path(e["loc"]) for e in refused.value.errors()]


# --- max_flips: section 3's noisy copies -------------------------------------------------------


def brute_force_copies(row, widths, k):
    """Every outcome vector within Hamming distance k of ``row``."""
    return {
        vector for vector in itertools.product(*(range(w) for w in widths))
        if sum(a != b for a, b in zip(vector, row)) <= k
    }


@pytest.mark.parametrize("max_flips", [0, 1, 2, 3])
def test_max_flips_expands_every_hypothesis_into_its_noisy_copies(max_flips):
    widths = [2, 3, 2, 4]
    rows = [[0, 2, 1, 3], [1, 0, 0, 0]]
    payload = {
        "tests": [{"id": f"t{j}", "outcomes": [str(k) for k in range(w)]} for j, w in enumerate(widths)],
        "matrix": rows, "classes": ["a", "b"], "priors": [0.25, 0.75], "hypothesis_ids": ["p", "q"],
        "max_flips": max_flips,
    }
    inst = compile_payload(payload)
    for h, name in enumerate(["p", "q"]):
        members = [i for i, hid in enumerate(inst.hypothesis_ids) if hid == name or hid.startswith(name + "~")]
        expected = brute_force_copies(rows[h], widths, max_flips)
        assert len(members) == len(expected) == engine.count_noisy_copies(np.array(widths), max_flips)
        assert {tuple(int(x) for x in inst.outcomes[i]) for i in members} == expected
        assert {inst.class_labels[inst.class_index[i]] for i in members} == {"ab"[h]}
        # With no error rate every copy shares the hypothesis' prior equally.
        assert inst.prior[members] == pytest.approx(np.full(len(members), [0.25, 0.75][h] / len(members)))
    assert inst.kind == "deterministic"


def test_max_flips_weights_copies_by_the_error_rate():
    payload = {
        "tests": [{"id": "t0"}, {"id": "t1"}],
        "matrix": [[0, 0], [1, 1]], "classes": ["a", "b"], "noise": 0.1, "max_flips": 1,
    }
    inst = compile_payload(payload)
    assert inst.kind == "deterministic"  # noise is spent on the copies, not on likelihoods
    prior = dict(zip(inst.hypothesis_ids, inst.prior))
    # Per hypothesis: the exact copy weighs 0.9·0.9, each one-flip copy 0.1·0.9; normalised within.
    exact, flipped = 0.81 / (0.81 + 2 * 0.09), 0.09 / (0.81 + 2 * 0.09)
    assert prior["0"] == pytest.approx(0.5 * exact)
    assert prior["0~t0=1"] == pytest.approx(0.5 * flipped) and prior["1~t1=0"] == pytest.approx(0.5 * flipped)


def test_count_noisy_copies_matches_the_binomial_sum():
    # Binary tests: Σ_{j ≤ k} C(N, j).
    for n_tests, k in [(5, 0), (5, 2), (10, 3), (20, 20)]:
        expected = sum(math.comb(n_tests, j) for j in range(k + 1))
        assert engine.count_noisy_copies(np.full(n_tests, 2), k) == expected


def test_max_flips_over_the_cell_limit_is_refused():
    payload = {
        "tests": [{"id": f"t{j}"} for j in range(20)],
        "matrix": [[0] * 20, [1] * 20], "classes": ["a", "b"], "max_flips": 3,
    }
    # 2 · (1 + 20 + 190 + 1140) copies × 20 tests = 54 040 cells.
    with pytest.raises(engine.InstanceTooLarge, match="max_flips=3") as refused:
        compile_payload(payload, max_cells=50_000)
    assert "54040" in str(refused.value)
    assert compile_payload(payload, max_cells=60_000).n_hypotheses == 2 * 1351


def test_an_instance_over_the_cell_limit_is_refused():
    with pytest.raises(engine.InstanceTooLarge):
        compile_payload(columnar(), max_cells=5)


def test_max_flips_cannot_apply_to_likelihoods():
    with pytest.raises(ValidationError) as refused:
        Instance.model_validate(edit(noisy, lambda p: p.update(max_flips=1)))
    assert "max_flips" in [json_path(e["loc"]) for e in refused.value.errors()]


# --- indistinguishable hypotheses ---------------------------------------------------------------


def test_indistinguishable_hypotheses_are_a_warning_and_a_stop_reason():
    payload = edit(per_hypothesis, set_in(["hypotheses", 2, "outcomes"], {"ecg": "abnormal", "trop": "low"}))
    inst = compile_payload(payload)  # angina (admit) and reflux (home) now answer alike
    assert len(inst.warnings) == 1
    assert "indistinguishable" in inst.warnings[0] and "'angina'" in inst.warnings[0] and "'reflux'" in inst.warnings[0]
    assert compile_payload(per_hypothesis()).warnings == ()
    # The run separates mi from the rest, then cannot go on.
    observations = engine.parse_observations(inst, [("trop", "low")])
    decision = engine.next_step(inst, observations)
    assert decision.stop_reason == engine.StopReason.INDISTINGUISHABLE
    # Hypotheses of the same class answering alike are not worth a warning.
    same_class = edit(payload, lambda p: p["hypotheses"][2].update({"class": "admit"}))
    assert compile_payload(same_class).warnings == ()
