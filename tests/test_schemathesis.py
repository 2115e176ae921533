"""Schemathesis over openapi.yaml (as the app serves it) against the WSGI app: every operation,
positive and negative data, a fixed example budget. No response may be a 5xx, and every
response must match the documented status codes, media types, headers and schemas.

Excluded: ``positive_data_acceptance``. JSON Schema cannot state the instance's cross-field
rules (every hypothesis gives an outcome for every test, likelihoods sum to 1, …), so data that
is schema-valid is routinely, and rightly, refused with 422.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from schemathesis.config._checks import NegativeDataRejectionConfig

from service.app import create_app

EXAMPLES_PER_OPERATION = 25


@pytest.fixture(scope="module")
def api_schema():
    app = create_app({"redis_url": None, "max_body_bytes": 256 * 1024, "max_cells": 100_000})
    schema = schemathesis.openapi.from_wsgi("/openapi.yaml", app)
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                    max_examples=EXAMPLES_PER_OPERATION, deterministic=True)
    # Schema-violating data may rightly be refused for its size (413) as well as its content.
    schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(
        expected_statuses=[400, 404, 405, 409, 412, 413, 415, 422])
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_every_operation_conforms_and_never_fails_on_the_server(case):
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
