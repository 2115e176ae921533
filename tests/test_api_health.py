"""Operations endpoints: health, readiness, metrics, the served contract."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from api_support import TRIAGE, assert_problem, new_session, observe
from conftest import free_port
from service.api.openapi import render
from service.api.context import EXTENSION
from service.app import create_app, rehearse, warm_up

ROOT = Path(__file__).resolve().parent.parent


def test_healthz_and_readyz(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/readyz").get_json() == {"status": "ready"}


@pytest.mark.parametrize("store_kind", ["redis"])
def test_an_unreachable_redis_makes_readyz_503_but_healthz_stays_up(app_config):
    app = create_app({**app_config, "redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    response = client.get("/readyz")
    assert_problem(response, 503, "store-unavailable")
    assert int(response.headers["Retry-After"]) >= 1
    posted = client.post("/v1/instances", json=TRIAGE)
    assert_problem(posted, 503, "store-unavailable")


def _connections(store) -> list[int]:
    """Connections each Redis pool of ``store`` has opened (None: the pool's client is not made)."""
    return [None if pool._client is None else pool._client.connection_pool._created_connections
            for pool in (store._redis, store._bulk)]


@pytest.mark.parametrize("store_kind", ["redis"])
def test_warm_up_opens_both_redis_pools_so_a_first_step_connects_nothing(app_config):
    app = create_app(app_config)
    store = app.extensions[EXTENSION].store
    assert _connections(store) == [None, None]
    warm_up(app)
    assert _connections(store) == [1, 1]
    client = app.test_client()
    instance_id = client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
    store.cache.discard(("public", instance_id))  # a cold worker: the instance comes from Redis
    assert client.post("/v1/sessions", json={"instance_id": instance_id}).status_code == 201
    assert _connections(store) == [1, 1]


@pytest.mark.parametrize("store_kind", ["redis", "memory"])
def test_warm_up_with_the_store_unreachable_neither_raises_nor_changes_readiness(app_config, caplog):
    app = create_app({**app_config, "redis_url": app_config["redis_url"] and f"redis://127.0.0.1:{free_port()}/0"})
    warm_up(app)  # logs, does not raise
    warm_up(object())  # not an edgecut app: left alone
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    if app_config["redis_url"]:
        assert "did not answer" in caplog.text
        assert_problem(client.get("/readyz"), 503, "store-unavailable")
    else:
        assert client.get("/readyz").status_code == 200


def test_rehearse_runs_the_engines_streamed_and_likelihood_passes_and_counts_nothing(monkeypatch, caplog):
    from prometheus_client import REGISTRY

    from service.engine import alpha

    ran = []
    for name in ("_classes_alpha", "_dense_stats"):
        real = getattr(alpha, name)
        monkeypatch.setattr(alpha, name, lambda *a, _real=real, _name=name, **k: ran.append(_name) or _real(*a, **k))
    counted = ("edgecut_sessions_created_total", "edgecut_observations_applied_total",
               "edgecut_selection_duration_seconds_count")
    before = [REGISTRY.get_sample_value(name) for name in counted]
    assert None not in before
    rehearse()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert {"_classes_alpha", "_dense_stats"} <= set(ran)  # what a big instance's first step runs, and a small one's
    assert [REGISTRY.get_sample_value(name) for name in counted] == before


def test_a_failing_rehearsal_is_logged_and_the_worker_goes_on(monkeypatch, caplog):
    import service.app

    monkeypatch.setattr(service.app, "_rehearsal_instances", lambda: [{"tests": []}])
    rehearse()  # does not raise
    assert "rehearsal failed" in caplog.text


@pytest.mark.redis
def test_a_gunicorn_worker_connects_before_its_first_request_and_boots_without_redis(redis_server):
    import redis

    from live_server import LiveServer

    prefix = f"warm-{uuid.uuid4().hex[:8]}"
    direct = redis.Redis.from_url(redis_server.url)
    before = {c["id"] for c in direct.client_list()}
    server = LiveServer({"REDIS_URL": redis_server.url, "KEY_PREFIX": prefix}, workers=1, threads=2)
    server.start()  # answers /healthz once the worker serves: after its warm-up, Redis answering
    try:
        opened = [c for c in direct.client_list() if c["id"] not in before and c["cmd"] == "ping"]
        assert len(opened) == 2, f"the worker opened {opened}"
    finally:
        server.stop()
        direct.close()
    unreachable = LiveServer({"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "KEY_PREFIX": prefix}, workers=1)
    unreachable.start()
    try:
        assert requests.get(unreachable.url + "/healthz", timeout=5).status_code == 200
        assert requests.get(unreachable.url + "/readyz", timeout=5).status_code == 503
    finally:
        unreachable.stop()


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus exposition text, parsed independently of the app."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_metrics_count_requests_by_route_and_status(client):
    before = client.get("/metrics").get_data(as_text=True)
    sid = new_session(client)["session_id"]
    observe(client, sid, {"test": "ecg", "outcome": "normal"})
    client.get("/v1/sessions/nope")
    after = client.get("/metrics").get_data(as_text=True)

    def delta(name, **labels):
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert delta("edgecut_http_requests_total", route="/v1/sessions", method="POST", status="201") == 1
    assert delta("edgecut_http_requests_total", route="/v1/sessions/<session_id>", method="GET", status="404") == 1
    assert delta("edgecut_http_request_duration_seconds_count", route="/v1/sessions/<session_id>/observations",
                 method="POST") == 1
    assert delta("edgecut_sessions_created_total") == 1
    assert delta("edgecut_selection_duration_seconds_count") >= 2


def test_the_contract_is_served_and_is_the_repository_file(client):
    response = client.get("/openapi.yaml")
    assert response.status_code == 200 and response.mimetype == "application/yaml"
    # The served bytes against the contract generated from the wire models now (a stale or
    # different file fails), and the repository's openapi.yaml must be that same file.
    assert response.data.decode() == render()
    assert (ROOT / "openapi.yaml").resolve() == (ROOT / "service" / "openapi.yaml").resolve()
    spec = yaml.safe_load(response.data)
    assert spec["openapi"].startswith("3.")
