"""POST /v1/sessions/{sid}/observations: every rule, and that a refused request leaves the stored
session exactly as it was."""

from __future__ import annotations

import uuid

import numpy as np
import orjson
import pytest

from api_support import NOISY, QUAD, TRIAGE, Delegating, app_over, assert_problem, new_session, observe, stored
from schemas.responses import SessionState, StepState
from service import engine
from service.app import create_app
from service.sessions.state import Step, step_of
from service.sessions.steps import StepCache, StepKey, belief_bytes
from tests.builders import compile_wire
from service.store import StoreUnavailable, VersionConflict


@pytest.fixture
def quad(client):
    return new_session(client, QUAD)["session_id"]


def test_a_batch_is_applied_in_order(client, quad):
    response = observe(client, quad, {"observations": [{"test": "b", "outcome": "1"}, {"test": "a", "outcome": "0"}]})
    assert response.status_code == 200 and response.headers["ETag"] == '"2"'
    state = response.get_json()
    assert [h["test"] for h in state["history"]] == ["b", "a"]
    assert state["done"] and state["map_class"] == "Y"
    assert stored(client.application, quad).observations == (("b", "1"), ("a", "0"))


def test_reposting_a_recorded_observation_is_a_no_op(client, quad):
    first = observe(client, quad, {"test": "a", "outcome": "0"})
    before = stored(client.application, quad)
    again = observe(client, quad, {"test": "a", "outcome": "0"})
    assert again.status_code == 200 and again.headers["ETag"] == first.headers["ETag"] == '"2"'
    assert again.get_json()["history"] == first.get_json()["history"]
    assert stored(client.application, quad) == before
    # A batch mixing a recorded one and a new one applies only the new one.
    mixed = observe(client, quad, {"observations": [{"test": "a", "outcome": "0"}, {"test": "b", "outcome": "0"}]})
    assert mixed.status_code == 200 and mixed.get_json()["step"] == 2
    assert stored(client.application, quad).version == before.version + 1


def test_replaying_the_last_observation_after_done_is_still_a_no_op(client, quad):
    observe(client, quad, {"test": "a", "outcome": "1"})  # class Z: done
    before = stored(client.application, quad)
    response = observe(client, quad, {"test": "a", "outcome": "1"})
    assert response.status_code == 200 and response.get_json()["done"]
    assert stored(client.application, quad) == before


@pytest.mark.parametrize("posted, status, code", [
    ({"test": "a", "outcome": "1"}, 409, "conflicting-observation"),  # a was observed as 0
    ({"test": "zz", "outcome": "1"}, 422, "unknown-test"),
    ({"test": "b", "outcome": "7"}, 422, "unknown-outcome"),
    ({"test": "c", "outcome": "1"}, 409, "inconsistent"),  # a=0 and c=1: no hypothesis left
    ({"observations": [{"test": "b", "outcome": "0"}, {"test": "zz", "outcome": "0"}]}, 422, "unknown-test"),
    ({"observations": [{"test": "b", "outcome": "0"}, {"test": "b", "outcome": "1"}]}, 409, "conflicting-observation"),
    ({"observations": [{"test": "a", "outcome": "0"}, {"test": "c", "outcome": "1"}]}, 409, "inconsistent"),
    ({"observations": [{"test": "b", "outcome": "0"}, {"test": "c", "outcome": "0"}]}, 409, "session-done"),
    ({"test": "b"}, 422, "validation-error"),
    ({"test": "b", "outcome": "0", "observations": [{"test": "b", "outcome": "0"}]}, 422, "validation-error"),
    ({"observations": []}, 422, "validation-error"),
    ({"test": "b", "outcome": ""}, 422, "validation-error"),
    ({"test": "b", "outcome": True}, 422, "validation-error"),
])
def test_refused_observations_leave_the_session_unchanged(client, quad, posted, status, code):
    observe(client, quad, {"test": "a", "outcome": "0"})
    before = stored(client.application, quad)
    assert_problem(observe(client, quad, posted), status, code)
    assert stored(client.application, quad) == before
    assert client.get(f"/v1/sessions/{quad}").headers["ETag"] == '"2"'


@pytest.mark.parametrize("posted", [
    {"test": "b", "outcome": "0"},
    # All or nothing: the batch's first observation would be fine on its own.
    {"observations": [{"test": "a", "outcome": "1"}, {"test": "b", "outcome": "0"}]},
])
def test_anything_new_after_done_is_409(client, quad, posted):
    if "observations" not in posted:
        observe(client, quad, {"test": "a", "outcome": "1"})
    before = stored(client.application, quad)
    assert_problem(observe(client, quad, posted), 409, "session-done")
    assert stored(client.application, quad) == before


def test_if_match(client, quad):
    stale = observe(client, quad, {"test": "a", "outcome": "0"}, headers={"If-Match": '"1"'})
    assert stale.status_code == 200 and stale.headers["ETag"] == '"2"'
    before = stored(client.application, quad)
    assert_problem(observe(client, quad, {"test": "b", "outcome": "0"}, headers={"If-Match": '"1"'}),
                   412, "precondition-failed")
    assert_problem(observe(client, quad, {"test": "b", "outcome": "0"}, headers={"If-Match": 'W/"2"'}),
                   412, "precondition-failed")  # weak tags never match strongly
    assert stored(client.application, quad) == before
    # A retry of an applied change with the old tag: already done, so 200 (RFC 9110 §13.1.1).
    replay = observe(client, quad, {"test": "a", "outcome": "0"}, headers={"If-Match": '"1"'})
    assert replay.status_code == 200 and stored(client.application, quad) == before
    assert observe(client, quad, {"test": "c", "outcome": "0"}, headers={"If-Match": '"5", "2"'}).status_code == 200
    assert observe(client, quad, {"test": "b", "outcome": "0"}, headers={"If-Match": "*"}).status_code == 200


# --- faults injected under the store contract --------------------------------------------


def test_an_expired_instance_is_410_and_the_session_is_kept(app_config):
    class Forgetful(Delegating):
        forgotten: set[str] = set()

        def get_instance(self, instance_id, tenant="public"):
            return None if instance_id in self.forgotten else super().get_instance(instance_id, tenant)

    app = app_over(app_config, Forgetful)
    client = app.test_client()
    session = new_session(client)
    before = stored(app, session["session_id"])
    Forgetful.forgotten = {before.instance_id}
    assert_problem(client.get(f"/v1/sessions/{session['session_id']}"), 410, "instance-expired")
    assert_problem(observe(client, session["session_id"], {"test": "ecg", "outcome": "normal"}), 410,
                   "instance-expired")
    assert stored(app, session["session_id"]) == before


def test_lost_compare_and_set_is_retried(app_config):
    class LosesOnce(Delegating):
        losses = 1

        def update_session(self, record, expected_version):
            if self.losses:
                self.losses -= 1
                raise VersionConflict("another worker won")
            return super().update_session(record, expected_version)

    app = app_over(app_config, LosesOnce)
    client = app.test_client()
    sid = new_session(client)["session_id"]
    response = observe(client, sid, {"test": "ecg", "outcome": "normal"})
    assert response.status_code == 200
    assert stored(app, sid).observations == (("ecg", "normal"),)


def test_always_losing_compare_and_set_is_409_and_nothing_changes(app_config):
    class AlwaysLoses(Delegating):
        def update_session(self, record, expected_version):
            raise VersionConflict("another worker won")

    app = app_over(app_config, AlwaysLoses)
    client = app.test_client()
    sid = new_session(client)["session_id"]
    before = stored(app, sid)
    assert_problem(observe(client, sid, {"test": "ecg", "outcome": "normal"}), 409, "concurrent-update")
    assert stored(app, sid) == before


# --- two workers on one Redis: each remembers the records it wrote ----------------------------


def _two_workers(redis_server):
    config = {"redis_url": redis_server.url, "key_prefix": f"workers-{uuid.uuid4().hex[:8]}"}
    return create_app(config), create_app(config)


@pytest.mark.redis
def test_an_observation_on_the_worker_that_wrote_the_session_last_is_one_round_trip(redis_server):
    app, _ = _two_workers(redis_server)
    client = app.test_client()
    sid = new_session(client, QUAD)["session_id"]
    store = app.extensions["edgecut"].store
    trips = store.round_trips
    state = observe(client, sid, {"test": "a", "outcome": "0"}).get_json()
    assert store.round_trips == trips + 1  # the compare-and-set, with no read before it
    assert state["step"] == 1 and stored(app, sid).observations == (("a", "0"),)


@pytest.mark.redis
def test_a_worker_whose_memory_of_a_session_went_stale_answers_from_what_is_stored(redis_server):
    mine, theirs = _two_workers(redis_server)
    client, other = mine.test_client(), theirs.test_client()
    sid = new_session(client, QUAD)["session_id"]
    assert observe(client, sid, {"test": "a", "outcome": "0"}).status_code == 200
    # Another worker takes that answer back and records another; this one still remembers "a" = 0.
    assert other.delete(f"/v1/sessions/{sid}/observations/a").status_code == 200
    assert observe(other, sid, {"test": "b", "outcome": "1"}).status_code == 200
    # Refused on what this worker remembers ("a" was 0), accepted on what is stored.
    response = observe(client, sid, {"test": "a", "outcome": "1"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert stored(mine, sid).observations == (("b", "1"), ("a", "1"))
    assert response.headers["ETag"] == '"5"'
    # Where nothing changes, too, its answer is the stored session's, not the one it remembers.
    assert other.delete(f"/v1/sessions/{sid}/observations/b").status_code == 200
    again = observe(client, sid, {"test": "a", "outcome": "1"})
    assert again.status_code == 200 and again.headers["ETag"] == '"6"'
    assert again.get_json()["history"] == [{"test": "a", "outcome": "1", "cost": 1.0}]


def test_store_unavailable_is_503_with_retry_after(app_config):
    class Down(Delegating):
        down = False

        def get_session(self, session_id, tenant="public"):
            if self.down:
                raise StoreUnavailable("connection refused")
            return super().get_session(session_id, tenant)

    app = app_over(app_config, Down)
    client = app.test_client()
    sid = new_session(client)["session_id"]
    before = stored(app, sid)
    Down.down = True
    response = observe(client, sid, {"test": "ecg", "outcome": "normal"})
    assert_problem(response, 503, "store-unavailable")
    assert response.headers["Retry-After"] == "1"
    Down.down = False
    assert stored(app, sid) == before


# --- plain-data bodies and the step cache ---------------------------------------------------


# Decision instances: acceptable sets (no losses), and losses on a likelihood instance.
DECISIONS = {
    "tests": [{"id": "cheap", "cost": 1, "outcomes": ["a", "b"]}, {"id": "dear", "cost": 10, "outcomes": ["x", "y"]}],
    "decisions": ["A", "B"],
    "hypotheses": [
        {"id": "h1", "acceptable": ["A"], "outcomes": {"cheap": "a", "dear": "y"}},
        {"id": "h2", "acceptable": ["A", "B"], "outcomes": {"cheap": "b", "dear": "x"}},
        {"id": "h3", "acceptable": ["B"], "outcomes": {"cheap": "b", "dear": "y"}},
    ],
}
LOSSES = {
    "tests": [{"id": "q", "outcomes": ["no", "yes"]}],
    "decisions": ["home", "hospital"],
    "hypotheses": [
        {"id": "minor", "prior": 0.7, "loss": {"home": 0, "hospital": 1}, "likelihoods": {"q": {"no": 0.9, "yes": 0.1}}},
        {"id": "major", "prior": 0.3, "loss": {"home": 20, "hospital": 0}, "likelihoods": {"q": {"no": 0.2, "yes": 0.8}}},
    ],
}


def _assert_model_bytes(response, model) -> dict:
    """The body is byte for byte what the wire model serialises from it (its members, their
    order, the optional ones left out when absent, the numbers as pydantic writes them)."""
    assert response.status_code in (200, 201), response.get_data(as_text=True)
    raw = response.get_data()
    assert model.model_validate_json(raw).model_dump_json().encode() == raw
    return orjson.loads(raw)


@pytest.mark.parametrize("instance", [TRIAGE, QUAD, NOISY, DECISIONS, LOSSES],
                         ids=["deterministic", "deterministic-3", "likelihood", "decision", "decision-losses"])
@pytest.mark.parametrize("explain", ["", "?explain=true"], ids=["plain", "explain"])
def test_every_session_body_is_byte_for_byte_its_wire_model(client, instance, explain):
    created = _assert_model_bytes(client.post(f"/v1/sessions{explain}", json={"instance": instance, "max_tests": 5}),
                                  SessionState)
    assert ("decision" in created) == (instance in (DECISIONS, LOSSES))
    assert ("expected_loss" in created.get("decision", {})) == (instance is LOSSES)
    assert ("candidates" in created) == bool(explain)
    sid, test = created["session_id"], created["next_test"]["id"]
    outcome = created["next_test"]["outcomes"][0]
    observed = _assert_model_bytes(client.post(f"/v1/sessions/{sid}/observations{explain}",
                                               json={"test": test, "outcome": outcome}), SessionState)
    _assert_model_bytes(client.get(f"/v1/sessions/{sid}{explain}"), SessionState)
    selected = _assert_model_bytes(client.post(f"/v1/select{explain}", json={
        "instance": instance, "observations": [{"test": test, "outcome": outcome}], "max_tests": 5}), StepState)
    assert selected == {k: v for k, v in observed.items() if k not in ("session_id", "expires_at")}
    # Corrected to a skip (charged or not, the history says so), then withdrawn.
    skipped = _assert_model_bytes(client.put(f"/v1/sessions/{sid}/observations/{test}{explain}",
                                             json={"skip": True}), SessionState)
    assert skipped["history"][0]["skipped"] is True and "outcome" not in skipped["history"][0]
    _assert_model_bytes(client.delete(f"/v1/sessions/{sid}/observations/{test}{explain}"), SessionState)


@pytest.mark.parametrize("explain", ["", "?explain=true"], ids=["plain", "explain"])
def test_pages_skips_and_stopped_sessions_are_byte_for_byte_their_wire_models(client, explain):
    state = _assert_model_bytes(client.post(f"/v1/sessions{explain}", json={
        "instance": {**QUAD, "skip_cost": "charged"}, "batch_size": 3}), SessionState)
    assert len(state["next_tests"]) == 2
    sid = state["session_id"]
    state = _assert_model_bytes(observe(client, sid, {"observations": [{"test": "a", "skip": True}]}), SessionState)
    assert state["history"] == [{"test": "a", "skipped": True, "cost": 1.0}]
    state = _assert_model_bytes(client.post(f"/v1/sessions/{sid}/observations{explain}", json={
        "observations": [{"test": "b", "outcome": "0"}, {"test": "c", "outcome": "0"}]}), SessionState)
    assert state["done"] and state["next_test"] is None and state["next_tests"] == []
    _assert_model_bytes(client.post(f"/v1/select{explain}", json={"instance": QUAD, "batch_size": 2,
                                                                  "observations": [{"test": "c", "skip": True}]}),
                        StepState)


def test_sessions_differing_only_in_their_seed_share_steps_unless_the_policy_draws(client, monkeypatch):
    decided = []
    original = engine.decide
    monkeypatch.setattr(engine, "decide", lambda *args, **kwargs: decided.append(args[1].name) or original(
        *args, **kwargs))
    for seed in (1, 2, 3):
        new_session(client, QUAD, seed=seed)
    assert decided == ["ec2"]
    for seed in (1, 2, 3):
        new_session(client, QUAD, seed=seed, policy="random")
    assert decided == ["ec2"] + ["random"] * 3


def test_the_step_after_an_observation_carries_the_belief_before_it_forward(client, monkeypatch):
    given = []
    original = engine.observe
    monkeypatch.setattr(engine, "observe", lambda inst, observations, previous=None: given.append(
        None if previous is None else len(previous.observations)) or original(inst, observations, previous))
    sid = new_session(client, QUAD)["session_id"]
    observe(client, sid, {"test": "a", "outcome": "0"})
    observe(client, sid, {"test": "b", "outcome": "1"})
    assert given == [None, 0, 1]


def test_a_belief_over_an_eighth_of_the_step_cache_is_not_kept_but_its_step_is():
    n = 2000
    wide = {"tests": [{"id": "t", "outcomes": ["0", "1"]}], "classes": [f"c{i}" for i in range(n)],
            "matrix": [[i % 2] for i in range(n)]}
    belief = engine.observe(compile_wire(wide), [])
    held = belief_bytes(belief)
    assert held >= 8 * n  # its arrays over the alive rows
    key = StepKey("alpha", "i" * 64, "ec2", engine.StopRules(), None, (), 1, (), (), ())
    step = Step(b'"done":false', np.full(1, np.nan), False, None, ())
    for budget, kept in ((8 * held - 8, False), (100 * held, True)):
        cache = StepCache(max_bytes=budget)
        cache.put(key, step, belief)
        assert cache.get(key) is step
        assert (cache.computed(key)[1] is belief) == kept
        assert 0 < cache.nbytes <= budget


@pytest.mark.parametrize("skip_cost", [None, "charged"])
def test_a_steps_history_lists_every_observation_with_its_cost(skip_cost):
    wire = {"tests": [{"id": "a", "outcomes": ["0", "1"], "cost": 1.5},
                      {"id": "b", "outcomes": ["0", "1"], "repeatable": True, "cost": 0.25},
                      {"id": "c", "outcomes": ["0", "1", "2"], "cost": 2.0}, {"id": "d", "outcomes": ["0", "1"]}],
            "classes": ["X", "X", "Y", "Y", "Z"],
            "likelihood_matrix": [[[0.8, 0.2], [0.7, 0.3], [0.5, 0.3, 0.2], [0.9, 0.1]],
                                  [[0.6, 0.4], [0.2, 0.8], [0.1, 0.1, 0.8], [0.5, 0.5]],
                                  [[0.3, 0.7], [0.5, 0.5], [0.3, 0.3, 0.4], [0.2, 0.8]],
                                  [[0.1, 0.9], [0.9, 0.1], [0.6, 0.2, 0.2], [0.4, 0.6]],
                                  [[0.5, 0.5], [0.4, 0.6], [0.2, 0.5, 0.3], [0.7, 0.3]]]}
    # Rectangular: a two-outcome test's cells have a third probability, 0.
    wire["likelihood_matrix"] = [[cell + [0.0] * (3 - len(cell)) for cell in row] for row in wire["likelihood_matrix"]]
    if skip_cost:
        wire["skip_cost"] = skip_cost
    inst = compile_wire(wire)
    policy = engine.resolve_policy(inst, "effecxtive")
    labelled = [("b", "1"), ("c", None), ("b", "0"), ("a", "1"), ("b", "1"), ("d", None)]
    observations = engine.parse_observations(inst, labelled)
    belief, expected = None, []
    for j in range(len(observations) + 1):
        belief = engine.observe(inst, observations[:j], belief)  # carried forward, as sessions do
        step = step_of(inst, "effecxtive", engine.decide(belief, policy))
        if j:
            test, outcome = labelled[j - 1]
            cost = {"a": 1.5, "b": 0.25, "c": 2.0, "d": 1.0}[test]
            expected.append({"test": test, "outcome": outcome, "cost": cost} if outcome is not None
                            else {"test": test, "skipped": True, "cost": cost if skip_cost else 0.0})
        assert orjson.loads(step.json)["history"] == expected


def test_a_step_keys_bytes_bound_its_labels_and_observations_from_above():
    import sys

    from service.sessions.steps import KEY_BYTES, OBSERVATION_BYTES, key_bytes

    inst = compile_wire({"tests": [{"id": "t", "outcomes": ["no", "yes"]},
                                   {"id": "a much longer test id é", "outcomes": ["0", "a long outcome label"]}],
                         "classes": ["X", "Y"], "matrix": [[0, 0], [1, 1]]})
    observations = (("t", "yes"), ("a much longer test id é", "a long outcome label"), ("t", None))
    key = StepKey("alpha", "i" * 64, "ec2", engine.StopRules(), None, ("a much longer test id é",), 1, (), (), observations)
    held = (sum(sys.getsizeof(label) for pair in observations for label in pair)
            + sys.getsizeof("a much longer test id é") + OBSERVATION_BYTES * len(observations) + KEY_BYTES)
    assert key_bytes(key, inst) >= held


# --- what one session holds, and what one request may cost --------------------------------------

# One repeatable test whose answers cancel in pairs: a session that never stops by itself.
COIN = {"tests": [{"id": "swab", "outcomes": ["neg", "pos"], "repeatable": True}],
        "hypotheses": [{"id": "well", "class": "well", "likelihoods": {"swab": {"neg": 0.8, "pos": 0.2}}},
                       {"id": "ill", "class": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8}}}]}


def _answers(n: int, start: int = 0) -> list[dict]:
    return [{"test": "swab", "outcome": "pos" if i % 2 else "neg"} for i in range(start, start + n)]


COIN_AND_XRAY = {"tests": [*COIN["tests"], {"id": "xray", "outcomes": ["clear", "shadow"]}],
                 "hypotheses": [{**h, "likelihoods": {**h["likelihoods"], "xray": {"clear": 0.5, "shadow": 0.5}}}
                                for h in COIN["hypotheses"]]}


def test_a_session_holds_at_most_session_max_observations(app_config):
    app = create_app({**app_config, "session_max_observations": 5})
    client = app.test_client()
    sid = new_session(client, COIN, confidence=0.999)["session_id"]
    assert observe(client, sid, {"observations": _answers(3)}, headers={"If-Match": '"1"'}).status_code == 200
    before = stored(app, sid)
    # Two more fit, the third does not: it is named, and nothing is stored.
    body = assert_problem(observe(client, sid, {"observations": _answers(4, 3)}, headers={"If-Match": '"2"'}),
                          413, "limit-exceeded")
    assert "SESSION_MAX_OBSERVATIONS" in body["detail"] and body["errors"][0]["path"] == "observations[2]"
    assert stored(app, sid) == before
    assert observe(client, sid, {"observations": _answers(2, 3)}, headers={"If-Match": '"2"'}).status_code == 200
    body = assert_problem(observe(client, sid, {"test": "swab", "outcome": "neg"}, headers={"If-Match": '"3"'}),
                          413, "limit-exceeded")
    assert body["errors"][0]["path"] == "test"
    assert stored(app, sid).observations == tuple(("swab", a["outcome"]) for a in _answers(5))


def test_replays_are_not_counted_against_session_max_observations(app_config):
    app = create_app({**app_config, "session_max_observations": 2})
    client = app.test_client()
    sid = new_session(client, COIN_AND_XRAY, confidence=0.999)["session_id"]
    assert observe(client, sid, {"test": "xray", "outcome": "clear"}).status_code == 200
    posted = [{"test": "xray", "outcome": "clear"}, *_answers(2)]  # a replay, then two new answers
    body = assert_problem(observe(client, sid, {"observations": posted}, headers={"If-Match": '"2"'}),
                          413, "limit-exceeded")
    assert body["errors"][0]["path"] == "observations[2]"  # the second answer: the replay holds no room
    assert observe(client, sid, {"observations": posted[:2]}, headers={"If-Match": '"2"'}).status_code == 200
    assert observe(client, sid, {"test": "xray", "outcome": "clear"}).status_code == 200  # a replay, when full


class _Ticking:
    """A work timer that advances one second every time it is read."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_batch_that_would_work_past_session_time_limit_is_422_and_stores_nothing(app_config):
    from service.api.context import EXTENSION

    app = create_app({**app_config, "session_time_limit": 3.5})
    app.extensions[EXTENSION].sessions.timer = _Ticking()
    client = app.test_client()
    sid = new_session(client, COIN, confidence=0.999)["session_id"]
    before = stored(app, sid)
    body = assert_problem(observe(client, sid, {"observations": _answers(6)}, headers={"If-Match": '"1"'}),
                          422, "infeasible")
    assert "SESSION_TIME_LIMIT" in body["detail"]
    assert stored(app, sid) == before
    # Read once when the request starts and once per observation after the first: three fit.
    assert observe(client, sid, {"observations": _answers(3)}, headers={"If-Match": '"1"'}).status_code == 200


def test_a_batch_writes_the_json_of_one_state_however_long_it_is(client, monkeypatch):
    # The states between a batch's observations are checked (is the session done?) but never
    # rendered: rendering each would copy the growing history once per observation.
    from service.sessions import steps as steps_module

    rendered = []
    original = steps_module.step_of
    monkeypatch.setattr(steps_module, "step_of", lambda *args: rendered.append(args[2].belief) or original(*args))
    sid = new_session(client, COIN, confidence=0.999)["session_id"]
    rendered.clear()
    for n, tag in ((1, '"1"'), (50, '"2"')):
        state = observe(client, sid, {"observations": _answers(n)}, headers={"If-Match": tag}).get_json()
        assert len(rendered) == 1 and len(rendered[0].observations) == state["step"]
        rendered.clear()
    assert state["step"] == 51
