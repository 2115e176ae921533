"""Schemathesis against the real thing: gunicorn (2 gthread workers) + a fixture
redis-server, API keys on, over HTTP. tests/test_schemathesis.py covers every operation in
process with positive and negative data; this file adds what only a live server shows:

* negative mode over every operation through the real stack (gunicorn's parser, the Redis store),
  with generated examples (the coverage phase's fixed boundary cases run in process there);
* stateful mode: schemathesis chains operations (POST /v1/instances → GET it, POST /v1/sessions →
  observe / read / delete it) from the ids in the response schemas.

Fixed example budgets keep the run bounded; any 5xx, or any response breaking the contract, fails.
``positive_data_acceptance`` is excluded for the reason tests/test_schemathesis.py gives
(instance rules JSON Schema cannot state).
"""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, positive_data_acceptance

from live_server import LiveServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

API_KEY = "schemathesis-live-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
NEGATIVE_EXAMPLES = 20
STATEFUL_EXAMPLES = 15
STATEFUL_STEPS = 6


@pytest.fixture(scope="module")
def live_url(redis_server):
    server = LiveServer({"REDIS_URL": redis_server.url, "KEY_PREFIX": f"st-{uuid.uuid4().hex[:8]}",
                         "API_KEYS": f"fuzz:{API_KEY}", "MAX_BODY_BYTES": "262144", "MAX_CELLS": "100000"},
                        workers=2, threads=4)
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def live_schema(live_url):
    schema = schemathesis.openapi.from_url(f"{live_url}/openapi.yaml")
    schema.config.update(base_url=live_url)
    # The coverage phase's cases are deterministic, made from the same served contract: they run
    # in process in tests/test_schemathesis.py. Here the generated examples take the real stack.
    schema.config.phases.coverage.enabled = False
    _accept_413_as_rejection(schema)
    # Both modes: an operation whose only input is a free-form path string has no negative data,
    # and schemathesis skips (fails, under pytest) a negative-only run of it.
    schema.config.generation.update(modes=[GenerationMode.NEGATIVE, GenerationMode.POSITIVE],
                                    max_examples=NEGATIVE_EXAMPLES, deterministic=True)
    return schema


def _accept_413_as_rejection(schema) -> None:
    # A schema-violating body can also be refused for its size (MAX_BODY_BYTES, or a MAX_* limit
    # named in a 413 limit-exceeded): a rejection all the same.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = sorted({*map(str, rejection.expected_statuses or ()), "400", "401", "404", "405",
                                          "409", "413", "415", "422", "429"})


schema = schemathesis.pytest.from_fixture("live_schema")


@schema.parametrize()
@settings(max_examples=NEGATIVE_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_negative_data_over_http_never_fails_on_the_server(case):
    response = case.call(headers=AUTH, timeout=10)
    case.validate_response(response, excluded_checks=[positive_data_acceptance],
                           additional_checks=[not_a_server_error])


def test_stateful_sequences_never_fail_on_the_server(live_url):
    stateful_schema = schemathesis.openapi.from_url(f"{live_url}/openapi.yaml")
    stateful_schema.config.update(base_url=live_url)
    _accept_413_as_rejection(stateful_schema)
    stateful_schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                             deterministic=True)
    machine = stateful_schema.as_state_machine()
    assert machine.bundles, "schemathesis found no links between operations: nothing stateful would run"

    class Workflow(machine):  # type: ignore[misc, valid-type]
        def get_call_kwargs(self, case):
            return {"headers": AUTH, "timeout": 10}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, excluded_checks=[positive_data_acceptance],
                                   additional_checks=[not_a_server_error], transport_kwargs=kwargs)

    Workflow.run(settings=settings(max_examples=STATEFUL_EXAMPLES, stateful_step_count=STATEFUL_STEPS,
                                   deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)))
