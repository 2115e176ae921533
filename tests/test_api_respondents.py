"""Real respondents over HTTP, through both stores: skips, unavailable tests, corrections,
repeatable tests, pages of questions, and instances as resources. Every refusal leaves the
stored session exactly as it was."""

from __future__ import annotations

import threading
import time

import pytest

from api_support import NOISY, QUAD, TRIAGE, assert_problem, new_session, observe, stored
from service.app import create_app

NOISY_REPEATABLE = {
    "tests": [{"id": "swab", "outcomes": ["neg", "pos"], "repeatable": True}],
    "hypotheses": [
        {"id": "well", "class": "well", "likelihoods": {"swab": {"neg": 0.9, "pos": 0.1}}},
        {"id": "ill", "class": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8}}},
    ],
}


def correct(client, sid, test, body, headers=None, query=""):
    return client.put(f"/v1/sessions/{sid}/observations/{test}{query}", json=body, headers=headers or {})


def withdraw(client, sid, test, headers=None, query=""):
    return client.delete(f"/v1/sessions/{sid}/observations/{test}{query}", headers=headers or {})


@pytest.fixture
def quad(client):
    return new_session(client, QUAD)["session_id"]


# --- skip ----------------------------------------------------------------------------------------


def test_a_skipped_test_is_recorded_free_and_never_proposed_again(client, quad):
    response = observe(client, quad, {"test": "a", "skip": True})
    assert response.status_code == 200 and response.headers["ETag"] == '"2"'
    state = response.get_json()
    assert state["history"] == [{"test": "a", "skipped": True, "cost": 0.0}]
    assert state["step"] == 0 and state["cost_spent"] == 0.0
    assert state["next_test"]["id"] == "c"  # a's twin; a itself is never proposed again
    assert stored(client.application, quad).observations == (("a", None),)
    # A replayed skip is a no-op; skips also come inside observations: [...].
    before = stored(client.application, quad)
    again = observe(client, quad, {"observations": [{"test": "a", "skip": True}]})
    assert again.status_code == 200 and again.headers["ETag"] == '"2"'
    assert stored(client.application, quad) == before


def test_a_charged_skip_costs_the_test(client):
    sid = new_session(client, {**TRIAGE, "skip_cost": "charged"})["session_id"]
    state = observe(client, sid, {"test": "ecg", "skip": True}).get_json()
    assert state["history"] == [{"test": "ecg", "skipped": True, "cost": 2.0}] and state["cost_spent"] == 2.0


def test_skipping_the_last_informative_test_stops_the_session(client, quad):
    observe(client, quad, {"test": "a", "outcome": "0"})  # X or Y: only b separates them
    state = observe(client, quad, {"test": "b", "skip": True}).get_json()
    assert state["done"] and state["stop_reason"] == "no_informative_test"
    assert state["next_test"] is None and state["next_tests"] == []


@pytest.mark.parametrize("posted, status, code", [
    ({"test": "a", "skip": True}, 409, "conflicting-observation"),  # a was answered
    ({"test": "zz", "skip": True}, 422, "unknown-test"),
    ({"test": "b", "skip": False}, 422, "validation-error"),
    ({"test": "b", "outcome": "0", "skip": True}, 422, "validation-error"),
    ({"observations": [{"test": "b", "skip": True}, {"test": "b", "outcome": "0"}]}, 409, "conflicting-observation"),
])
def test_refused_skips_leave_the_session_unchanged(client, quad, posted, status, code):
    observe(client, quad, {"test": "a", "outcome": "0"})
    before = stored(client.application, quad)
    assert_problem(observe(client, quad, posted), status, code)
    assert stored(client.application, quad) == before


def test_an_answer_to_a_skipped_test_is_a_conflict_until_corrected(client, quad):
    observe(client, quad, {"test": "b", "skip": True})
    body = assert_problem(observe(client, quad, {"test": "b", "outcome": "0"}), 409, "conflicting-observation")
    assert "PUT" in body["detail"]
    fixed = correct(client, quad, "b", {"outcome": "0"})
    assert fixed.status_code == 200
    assert fixed.get_json()["history"] == [{"test": "b", "outcome": "0", "cost": 1.0}]


def test_select_takes_skips_and_exclusions(client):
    response = client.post("/v1/select", json={"instance": QUAD, "observations": [{"test": "a", "skip": True}],
                                               "exclude_tests": ["c"]})
    state = response.get_json()
    assert response.status_code == 200 and state["next_test"]["id"] == "b"
    assert state["history"] == [{"test": "a", "skipped": True, "cost": 0.0}]


# --- exclude_tests -------------------------------------------------------------------------------


def test_excluded_tests_are_never_proposed(client):
    state = new_session(client, QUAD, exclude_tests=["a"])
    assert state["next_test"]["id"] == "c"
    state = observe(client, state["session_id"], {"test": "c", "outcome": "0"}).get_json()
    assert state["next_test"]["id"] == "b"


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/select"])
def test_unknown_excluded_tests_are_422_with_their_paths_and_store_nothing(client, path):
    response = client.post(path, json={"instance": QUAD, "exclude_tests": ["a", "nope", "b", "gone"]})
    body = assert_problem(response, 422, "unknown-test")
    assert [e["path"] for e in body["errors"]] == ["exclude_tests[1]", "exclude_tests[3]"]
    assert client.get("/v1/instances").get_json()["items"] == []  # the inline instance was not kept


def test_an_idempotency_key_replay_must_repeat_the_exclusions(client):
    headers = {"Idempotency-Key": "visit-1"}
    first = client.post("/v1/sessions", json={"instance": QUAD, "exclude_tests": ["a"]}, headers=headers)
    again = client.post("/v1/sessions", json={"instance": QUAD, "exclude_tests": ["a"]}, headers=headers)
    assert again.get_json()["session_id"] == first.get_json()["session_id"]
    assert_problem(client.post("/v1/sessions", json={"instance": QUAD}, headers=headers), 409,
                   "idempotency-key-reused")


# --- corrections ---------------------------------------------------------------------------------


def test_a_correction_recomputes_from_the_facts_and_a_done_session_goes_on(client, quad):
    done = observe(client, quad, {"test": "a", "outcome": "1"}).get_json()  # Z: done
    assert done["done"] and done["stop_reason"] == "determined"
    response = correct(client, quad, "a", {"outcome": "0"}, headers={"If-Match": '"2"'})
    assert response.status_code == 200 and response.headers["ETag"] == '"3"'
    state = response.get_json()
    assert not state["done"] and state["next_test"]["id"] == "b"
    assert state["history"] == [{"test": "a", "outcome": "0", "cost": 1.0}]
    assert set(state["class_posterior"]) == {"X", "Y"}
    # The same correction again is a no-op, even with the tag it was first sent with.
    before = stored(client.application, quad)
    replay = correct(client, quad, "a", {"outcome": "0"}, headers={"If-Match": '"2"'})
    assert replay.status_code == 200 and replay.headers["ETag"] == '"3"'
    assert stored(client.application, quad) == before


def test_an_answer_can_become_a_skip_and_back(client, quad):
    observe(client, quad, {"test": "a", "outcome": "0"})
    state = correct(client, quad, "a", {"skip": True}).get_json()
    assert state["history"] == [{"test": "a", "skipped": True, "cost": 0.0}] and state["next_test"]["id"] == "c"
    state = correct(client, quad, "a", {"outcome": "1"}).get_json()
    assert state["history"] == [{"test": "a", "outcome": "1", "cost": 1.0}] and state["done"]


@pytest.mark.parametrize("test, body, headers, status, code", [
    ("c", {"outcome": "1"}, {}, 409, "inconsistent"),  # a=0 and c=1: no hypothesis left
    ("c", {"skip": True}, {"If-Match": '"2"'}, 412, "precondition-failed"),
    ("b", {"outcome": "0"}, {}, 404, "observation-not-found"),
    ("zz", {"outcome": "0"}, {}, 422, "unknown-test"),
    ("c", {"outcome": "7"}, {}, 422, "unknown-outcome"),
    ("c", {"outcome": "0", "skip": True}, {}, 422, "validation-error"),
    ("c", {}, {}, 422, "validation-error"),
])
def test_refused_corrections_change_nothing(client, quad, test, body, headers, status, code):
    observe(client, quad, {"test": "a", "outcome": "0"})
    observe(client, quad, {"test": "c", "outcome": "0"})  # version 3
    before = stored(client.application, quad)
    assert_problem(correct(client, quad, test, body, headers=headers), status, code)
    assert stored(client.application, quad) == before


def test_a_withdrawal_forgets_the_observation_and_a_retry_is_404(client, quad):
    observe(client, quad, {"observations": [{"test": "a", "outcome": "0"}, {"test": "b", "outcome": "1"}]})
    response = withdraw(client, quad, "b", headers={"If-Match": '"2"'})
    assert response.status_code == 200 and response.headers["ETag"] == '"3"'
    state = response.get_json()
    assert [h["test"] for h in state["history"]] == ["a"] and state["next_test"]["id"] == "b"
    before = stored(client.application, quad)
    assert_problem(withdraw(client, quad, "b"), 404, "observation-not-found")
    assert_problem(withdraw(client, quad, "a", headers={"If-Match": '"2"'}), 412, "precondition-failed")
    assert_problem(withdraw(client, quad, "zz"), 422, "unknown-test")
    assert stored(client.application, quad) == before


def _concurrently(app, quad, headers):
    """Skip a and skip c at the same moment from two clients; their statuses by test."""
    barrier = threading.Barrier(2)
    statuses: dict[str, int] = {}

    def send(test: str) -> None:
        other = app.test_client()
        barrier.wait()
        statuses[test] = correct(other, quad, test, {"skip": True}, headers=headers).status_code

    threads = [threading.Thread(target=send, args=(test,)) for test in ("a", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def test_concurrent_corrections_with_one_tag_have_exactly_one_winner(client, quad):
    observe(client, quad, {"observations": [{"test": "a", "outcome": "0"}, {"test": "c", "outcome": "0"}]})
    statuses = _concurrently(client.application, quad, {"If-Match": '"2"'})
    assert sorted(statuses.values()) == [200, 412], statuses
    record = stored(client.application, quad)
    winner = next(test for test, status in statuses.items() if status == 200)
    assert record.version == 3 and dict(record.observations)[winner] is None
    assert sum(outcome is None for _, outcome in record.observations) == 1


def test_concurrent_corrections_without_a_tag_are_both_applied(client, quad):
    observe(client, quad, {"observations": [{"test": "a", "outcome": "0"}, {"test": "c", "outcome": "0"}]})
    assert _concurrently(client.application, quad, {}) == {"a": 200, "c": 200}
    record = stored(client.application, quad)
    assert record.version == 4 and record.observations == (("a", None), ("c", None))


# --- repeatable tests ----------------------------------------------------------------------------


def test_a_repeatable_answer_needs_if_match_and_counts_each_time(client):
    sid = new_session(client, NOISY_REPEATABLE, confidence=0.999)["session_id"]
    before = stored(client.application, sid)
    assert_problem(observe(client, sid, {"test": "swab", "outcome": "pos"}), 428, "precondition-required")
    assert_problem(observe(client, sid, {"test": "swab", "outcome": "pos"}, headers={"If-Match": "*"}), 428,
                   "precondition-required")  # "*" names no version
    assert stored(client.application, sid) == before
    first = observe(client, sid, {"test": "swab", "outcome": "pos"}, headers={"If-Match": '"1"'})
    assert first.status_code == 200 and first.get_json()["next_test"]["id"] == "swab"  # asked again
    # A retry with the same tag cannot count the answer twice.
    assert_problem(observe(client, sid, {"test": "swab", "outcome": "pos"}, headers={"If-Match": '"1"'}),
                   412, "precondition-failed")
    second = observe(client, sid, {"test": "swab", "outcome": "pos"}, headers={"If-Match": '"2"'}).get_json()
    assert [h["outcome"] for h in second["history"]] == ["pos", "pos"] and second["step"] == 2
    # By Bayes: P(ill | +, +) = 0.64 / (0.64 + 0.01).
    assert second["class_posterior"]["ill"] == pytest.approx(0.64 / 0.65, rel=1e-12)


TWO_NOISY_ONE_REPEATABLE = {
    "tests": [{"id": "swab", "outcomes": ["neg", "pos"], "repeatable": True}, {"id": "xray", "outcomes": ["clear", "shadow"]}],
    "hypotheses": [
        {"id": "well", "class": "well", "likelihoods": {"swab": {"neg": 0.9, "pos": 0.1},
                                                         "xray": {"clear": 0.7, "shadow": 0.3}}},
        {"id": "ill", "class": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8},
                                                       "xray": {"clear": 0.4, "shadow": 0.6}}},
    ],
}


@pytest.mark.parametrize("instance", [NOISY_REPEATABLE, TWO_NOISY_ONE_REPEATABLE], ids=["alone", "with-another"])
@pytest.mark.parametrize("headers", [{}, {"If-Match": '"1"'}, {"If-Match": '"2"'}], ids=["no-tag", "stale", "current"])
def test_a_reposted_skip_of_a_repeatable_test_is_a_replay(client, instance, headers):
    # Only answers to a repeatable test count each time; a skip is a fact like any other, so
    # posting it again changes nothing and answers 200, whatever the tag (the change was applied).
    sid = new_session(client, instance, confidence=0.999)["session_id"]
    skipped = observe(client, sid, {"test": "swab", "skip": True}, headers={"If-Match": '"1"'})
    assert skipped.status_code == 200 and skipped.headers["ETag"] == '"2"'
    before = stored(client.application, sid)
    again = observe(client, sid, {"test": "swab", "skip": True}, headers=headers)
    assert again.status_code == 200, again.get_data(as_text=True)
    assert again.headers["ETag"] == '"2"' and again.get_json() == {**skipped.get_json(),
                                                                   "expires_at": again.get_json()["expires_at"]}
    assert again.get_json()["history"] == [{"test": "swab", "skipped": True, "cost": 0.0}]
    assert stored(client.application, sid) == before


def test_one_answer_of_a_repeated_test_is_corrected_by_its_occurrence(client):
    sid = new_session(client, NOISY_REPEATABLE, confidence=0.999)["session_id"]
    observe(client, sid, {"observations": [{"test": "swab", "outcome": "pos"}, {"test": "swab", "outcome": "neg"}]},
            headers={"If-Match": '"1"'})
    before = stored(client.application, sid)
    assert_problem(correct(client, sid, "swab", {"outcome": "neg"}), 409, "ambiguous-observation")
    assert_problem(correct(client, sid, "swab", {"outcome": "neg"}, query="?occurrence=3"), 404,
                   "observation-not-found")
    assert_problem(correct(client, sid, "swab", {"outcome": "neg"}, query="?occurrence=0"), 400, "invalid-parameter")
    assert_problem(withdraw(client, sid, "swab", query="?occurrence=1"), 428, "precondition-required")
    assert stored(client.application, sid) == before
    fixed = correct(client, sid, "swab", {"outcome": "neg"}, query="?occurrence=1").get_json()
    assert [h["outcome"] for h in fixed["history"]] == ["neg", "neg"]
    left = withdraw(client, sid, "swab", headers={"If-Match": '"3"'}, query="?occurrence=2").get_json()
    assert [h["outcome"] for h in left["history"]] == ["neg"]


def test_a_deterministic_instance_refuses_repeatable_tests(client):
    instance = {**QUAD, "tests": [{**QUAD["tests"][0], "repeatable": True}, *QUAD["tests"][1:]]}
    body = assert_problem(client.post("/v1/instances", json=instance), 422, "validation-error")
    assert [e["path"] for e in body["errors"]] == ["tests[0].repeatable"]


# --- a page of questions -------------------------------------------------------------------------


def test_a_batch_session_proposes_a_page_and_takes_answers_in_any_order(client):
    state = new_session(client, QUAD, batch_size=3)
    assert [t["id"] for t in state["next_tests"]] == ["a", "b"]  # c would repeat a
    assert state["next_test"] == state["next_tests"][0]
    sid = state["session_id"]
    # a=1 settles the class; b, shown on the same page, is still accepted afterwards.
    done = observe(client, sid, {"test": "a", "outcome": "1"}).get_json()
    assert done["done"] and done["next_tests"] == []
    late = observe(client, sid, {"test": "b", "outcome": "0"})
    assert late.status_code == 200 and [h["test"] for h in late.get_json()["history"]] == ["a", "b"]
    before = stored(client.application, sid)
    assert_problem(observe(client, sid, {"test": "c", "outcome": "1"}), 409, "session-done")  # not on the page
    assert stored(client.application, sid) == before


@pytest.mark.parametrize("batch_size", [2, 3])
def test_the_rest_of_the_last_page_is_accepted_for_every_page_size(client, batch_size):
    # QUAD proposes a and b together (c would repeat a) whatever the page size above 1; a=1
    # settles the class, and b, shown on the same page, is still taken.
    state = new_session(client, QUAD, batch_size=batch_size)
    assert [t["id"] for t in state["next_tests"]] == ["a", "b"]
    sid = state["session_id"]
    assert observe(client, sid, {"test": "a", "outcome": "1"}).get_json()["done"]
    late = observe(client, sid, {"test": "b", "outcome": "0"})
    assert late.status_code == 200, late.get_data(as_text=True)
    assert [h["test"] for h in late.get_json()["history"]] == ["a", "b"]


def test_a_one_test_session_takes_nothing_after_it_stops(client):
    sid = new_session(client, QUAD)["session_id"]
    assert observe(client, sid, {"test": "a", "outcome": "1"}).get_json()["done"]
    assert_problem(observe(client, sid, {"test": "b", "outcome": "0"}), 409, "session-done")


# Sixteen hypotheses, each its own class, named by four independent bits: every test stays
# informative until it is run, so a page is as long as the rules allow.
BITS = {"tests": [{"id": f"bit{j}", "outcomes": ["0", "1"]} for j in range(4)],
        "classes": [f"h{i}" for i in range(16)], "matrix": [[(i >> j) & 1 for j in range(4)] for i in range(16)]}


@pytest.mark.parametrize("posted", [
    [],
    [{"test": "bit0", "skip": True}],
    [{"test": "bit0", "skip": True}, {"test": "bit1", "skip": True}],
    [{"test": "bit0", "outcome": "1"}],
    [{"test": "bit0", "outcome": "1"}, {"test": "bit1", "skip": True}],
])
@pytest.mark.parametrize("batch_size, max_tests", [(3, 3), (4, 2), (2, 4)])
def test_a_page_holds_as_many_tests_as_answers_left_and_skips_are_not_answers(client, posted, batch_size, max_tests):
    sid = new_session(client, BITS, batch_size=batch_size, max_tests=max_tests)["session_id"]
    state = observe(client, sid, {"observations": posted}).get_json() if posted else client.get(
        f"/v1/sessions/{sid}").get_json()
    answered = sum("outcome" in o for o in posted)
    open_tests = 4 - len(posted)  # every test not yet run or skipped splits the survivors
    assert len(state["next_tests"]) == min(batch_size, max_tests - answered, open_tests)
    assert state["step"] == answered


def test_a_page_answered_as_a_subset_in_reverse(client):
    sid = new_session(client, QUAD, batch_size=2)["session_id"]
    state = observe(client, sid, {"test": "b", "outcome": "1"}).get_json()
    assert not state["done"] and state["next_tests"][0]["id"] == "a"


def test_select_answers_a_page(client):
    state = client.post("/v1/select", json={"instance": QUAD, "batch_size": 2}).get_json()
    assert [t["id"] for t in state["next_tests"]] == ["a", "b"]


@pytest.mark.parametrize("batch_size, status, code", [(0, 422, "validation-error"), (33, 422, "validation-error"),
                                                      (True, 422, "validation-error")])
def test_bad_batch_sizes_are_422(client, batch_size, status, code):
    assert_problem(client.post("/v1/sessions", json={"instance": QUAD, "batch_size": batch_size}), status, code)


def test_a_batch_beyond_the_work_limit_is_refused_before_the_session_starts(client):
    wide = {"tests": [{"id": f"t{j}", "outcomes": [str(k) for k in range(10)]} for j in range(6)],
            "likelihood_matrix": [[[0.1] * 10] * 6, [[0.2, 0.8] + [0.0] * 8] * 6], "classes": ["a", "b"]}
    body = assert_problem(client.post("/v1/sessions", json={"instance": wide, "batch_size": 5}), 422, "infeasible")
    assert "MAX_BATCH_BRANCHES" in body["detail"]


# --- instances as resources ----------------------------------------------------------------------


def _posted_in_its_own_millisecond(client, payload) -> str:
    """Post ``payload`` once the clock has left the millisecond it is in: a listing orders
    instances stored in one millisecond by id, not by the order they came in."""
    started = int(time.time() * 1000)
    while int(time.time() * 1000) == started:
        time.sleep(0.0002)
    return client.post("/v1/instances", json=payload).get_json()["instance_id"]


def test_instances_are_listed_a_page_at_a_time(client):
    ids = [_posted_in_its_own_millisecond(client, payload) for payload in (TRIAGE, QUAD, NOISY)]
    first = client.get("/v1/instances?limit=2")
    assert first.status_code == 200
    page = first.get_json()
    assert [item["instance_id"] for item in page["items"]] == ids[:2]
    assert set(page["items"][0]) == {"instance_id", "kind", "n_hypotheses", "n_tests", "n_classes", "created_at"}
    assert page["items"][0]["created_at"].endswith("Z")
    rest = client.get(f"/v1/instances?limit=2&cursor={page['next_cursor']}").get_json()
    assert [item["instance_id"] for item in rest["items"]] == ids[2:] and rest["next_cursor"] is None


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "limit=x", "cursor=abc", "cursor=" + "9" * 80])
def test_bad_listing_parameters_are_400(client, query):
    assert_problem(client.get(f"/v1/instances?{query}"), 400, "invalid-parameter")


def test_a_deleted_instance_makes_its_sessions_410_gone(client):
    sid = new_session(client, TRIAGE)["session_id"]
    instance_id = stored(client.application, sid).instance_id
    deleted = client.delete(f"/v1/instances/{instance_id}")
    assert deleted.status_code == 204 and "Content-Type" not in deleted.headers
    assert client.delete(f"/v1/instances/{instance_id}").status_code == 204  # a retry
    assert_problem(client.get(f"/v1/sessions/{sid}"), 410, "instance-gone")
    assert_problem(observe(client, sid, {"test": "ecg", "outcome": "normal"}), 410, "instance-gone")
    assert_problem(client.get(f"/v1/instances/{instance_id}"), 404, "instance-not-found")
    assert client.get("/v1/instances").get_json()["items"] == []
    assert_problem(client.delete("/v1/instances/" + "0" * 64), 404, "instance-not-found")


def test_deleting_an_instance_leaves_other_tenants_alone(app_config):
    keys = {"alpha": "alpha-key-0123456789abcdef", "bravo": "bravo-key-0123456789abcdef"}
    app = create_app({**app_config, "api_keys": ", ".join(f"{t}:{k}" for t, k in keys.items())})
    client = app.test_client()
    auth = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    sessions = {t: client.post("/v1/sessions", json={"instance": TRIAGE}, headers=auth[t]).get_json()["session_id"]
                for t in keys}
    instance_id = client.get("/v1/instances", headers=auth["alpha"]).get_json()["items"][0]["instance_id"]
    assert client.delete(f"/v1/instances/{instance_id}", headers=auth["alpha"]).status_code == 204
    assert_problem(client.get(f"/v1/sessions/{sessions['alpha']}", headers=auth["alpha"]), 410, "instance-gone")
    assert client.get(f"/v1/sessions/{sessions['bravo']}", headers=auth["bravo"]).status_code == 200
    assert [i["instance_id"] for i in client.get("/v1/instances", headers=auth["bravo"]).get_json()["items"]] == \
        [instance_id]


def test_bodies_with_skips_and_pages_are_exactly_their_wire_models(client):
    from schemas.responses import SessionState, StepState

    state = new_session(client, {**QUAD, "skip_cost": "charged"}, batch_size=3)
    state = observe(client, state["session_id"], {"observations": [{"test": "a", "skip": True},
                                                                    {"test": "b", "outcome": "0"}]}).get_json()
    assert state["history"][0] == {"test": "a", "skipped": True, "cost": 1.0} and state["next_tests"]
    absent = {"candidates", "decision", "decision_posterior"}  # optional extras, left out when absent
    assert SessionState.model_validate(state).model_dump(exclude=absent) == state
    step = client.post("/v1/select", json={"instance": QUAD, "batch_size": 2,
                                           "observations": [{"test": "c", "skip": True}]}).get_json()
    assert StepState.model_validate(step).model_dump(exclude=absent) == step
