"""Instances and helpers shared by the API tests (tests/test_api_*.py)."""

from __future__ import annotations

from dataclasses import replace

from service.store import DEFAULT_TENANT, SessionStore

PROBLEM = "application/problem+json"

# The README's triage instance. By hand: P(admit) = 0.1 + 0.3, P(home) = 0.6; the ECG separates
# the classes, so EC² picks it first and one ECG result determines the class.
TRIAGE = {
    "tests": [
        {"id": "ecg", "cost": 2.0, "outcomes": ["normal", "abnormal"]},
        {"id": "troponin", "cost": 1.0},
    ],
    "hypotheses": [
        {"id": "mi", "class": "admit", "prior": 0.1, "outcomes": {"ecg": "abnormal", "troponin": "high"}},
        {"id": "angina", "class": "admit", "prior": 0.3, "outcomes": {"ecg": "abnormal", "troponin": "low"}},
        {"id": "reflux", "class": "home", "prior": 0.6, "outcomes": {"ecg": "normal", "troponin": "low"}},
    ],
}

# The same content in the columnar form (troponin's labels sorted, as the per-hypothesis form
# derives them when a test does not list its outcomes).
TRIAGE_COLUMNAR = {
    "tests": [
        {"id": "ecg", "cost": 2.0, "outcomes": ["normal", "abnormal"]},
        {"id": "troponin", "cost": 1.0, "outcomes": ["high", "low"]},
    ],
    "hypothesis_ids": ["mi", "angina", "reflux"],
    "classes": ["admit", "admit", "home"],
    "priors": [0.1, 0.3, 0.6],
    "matrix": [[1, 0], [1, 1], [0, 1]],
}

# Four equally likely hypotheses, three classes; test c repeats test a. By hand (weights 1/16
# per edge): w(E) = X–Y 1/16 + X–Z 2/16 + Y–Z 2/16 = 5/16. Δ(a) = 5/16 − ½·1/16 = 9/32,
# Δ(b) = 5/16 − (½·1/16 + ½·1/16) = 8/32, Δ(c) = Δ(a) (ties go to the earlier test): a first.
# After a=0 only X and Y remain and b separates them; a=0 then c=1 contradicts everything.
QUAD = {
    "tests": [{"id": "a", "outcomes": ["0", "1"]}, {"id": "b", "outcomes": ["0", "1"]},
              {"id": "c", "outcomes": ["0", "1"]}],
    "hypotheses": [
        {"id": "h1", "class": "X", "outcomes": {"a": "0", "b": "0", "c": "0"}},
        {"id": "h2", "class": "Y", "outcomes": {"a": "0", "b": "1", "c": "0"}},
        {"id": "h3", "class": "Z", "outcomes": {"a": "1", "b": "0", "c": "1"}},
        {"id": "h4", "class": "Z", "outcomes": {"a": "1", "b": "1", "c": "1"}},
    ],
}

# A likelihood instance: one noisy test.
NOISY = {
    "tests": [{"id": "swab", "outcomes": ["neg", "pos"]}],
    "hypotheses": [
        {"id": "well", "class": "well", "likelihoods": {"swab": {"neg": 0.9, "pos": 0.1}}},
        {"id": "ill", "class": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8}}},
    ],
}


def store_of(app) -> SessionStore:
    return app.extensions["edgecut"].store


def stored(app, session_id: str):
    """The session as the store holds it (expiry aside, which slides on every read)."""
    record = store_of(app).get_session(session_id, DEFAULT_TENANT)
    return None if record is None else replace(record, expires_at=0.0)


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == PROBLEM
    body = response.get_json(force=True)
    assert body["status"] == status
    assert body["type"] == f"urn:edgecut:problem:{code}"
    assert body["title"] and body["detail"]
    assert "Traceback" not in response.get_data(as_text=True)
    return body


def new_session(client, instance=TRIAGE, **options) -> dict:
    response = client.post("/v1/sessions", json={"instance": instance, **options})
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


def observe(client, session_id: str, body: dict, headers: dict | None = None):
    return client.post(f"/v1/sessions/{session_id}/observations", json=body, headers=headers or {})


def app_over(app_config: dict, wrapper: type[Delegating]):
    """An app over the store ``app_config`` names, wrapped in ``wrapper`` (faults injected)."""
    from service.app import create_app
    from service.store import create_store

    inner = create_store(app_config["redis_url"], session_ttl=3600, key_prefix=app_config["key_prefix"])
    return create_app(app_config, store=wrapper(inner))


class Delegating(SessionStore):
    """A store that forwards to a real one; tests override single methods to inject faults."""

    def __init__(self, inner: SessionStore):
        self.inner = inner

    def put_instance(self, instance, tenant=DEFAULT_TENANT):
        return self.inner.put_instance(instance, tenant)

    def get_instance(self, instance_id, tenant=DEFAULT_TENANT):
        return self.inner.get_instance(instance_id, tenant)

    def list_instances(self, tenant=DEFAULT_TENANT, limit=50, after=None):
        return self.inner.list_instances(tenant, limit, after)

    def delete_instance(self, instance_id, tenant=DEFAULT_TENANT):
        return self.inner.delete_instance(instance_id, tenant)

    def instance_deleted(self, instance_id, tenant=DEFAULT_TENANT):
        return self.inner.instance_deleted(instance_id, tenant)

    def create_session(self, record):
        return self.inner.create_session(record)

    def get_session(self, session_id, tenant=DEFAULT_TENANT):
        return self.inner.get_session(session_id, tenant)

    def update_session(self, record, expected_version):
        return self.inner.update_session(record, expected_version)

    def delete_session(self, session_id, tenant=DEFAULT_TENANT):
        return self.inner.delete_session(session_id, tenant)

    def claim_idempotency_key(self, key, session_id, tenant=DEFAULT_TENANT):
        return self.inner.claim_idempotency_key(key, session_id, tenant)

    def idempotency_binding(self, key, tenant=DEFAULT_TENANT):
        return self.inner.idempotency_binding(key, tenant)

    def get_value(self, name, tenant=DEFAULT_TENANT):
        return self.inner.get_value(name, tenant)

    def put_value(self, name, value, tenant=DEFAULT_TENANT):
        return self.inner.put_value(name, value, tenant)

    def exposure_counts(self, instance_id, tenant=DEFAULT_TENANT, at_least=0.0):
        return self.inner.exposure_counts(instance_id, tenant, at_least)

    def count_exposure(self, instance_id, tenant=DEFAULT_TENANT, *, sessions=0, tests=()):
        return self.inner.count_exposure(instance_id, tenant, sessions=sessions, tests=tests)

    def rate_limiter(self, rate, scope):
        return self.inner.rate_limiter(rate, scope)

    def ping(self):
        return self.inner.ping()
