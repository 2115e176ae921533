"""A gunicorn config for tests/test_big_request_slot.py: in the worker, a request whose instance's
first test is named ``hold`` waits after its body was read and checked, by the worker or by its
isolated process (so holding the worker's big-request slot), until the file EDGECUT_TEST_RELEASE
names exists; it creates the file EDGECUT_TEST_HOLDING names once it waits. Files, not sleeps: the test knows when it holds."""

import os
import time
from pathlib import Path


def _hold() -> None:
    Path(os.environ["EDGECUT_TEST_HOLDING"]).touch()
    deadline = time.monotonic() + 60  # a failed test must not leave the worker held
    while not Path(os.environ["EDGECUT_TEST_RELEASE"]).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def post_worker_init(worker):
    from service.api import bodies

    checked, isolated = bodies.check_request, bodies.parsed_in_isolation

    def check_then_hold(parsed, settings):
        checked(parsed, settings)
        tests = getattr(parsed, "tests", None)
        if tests and tests[0].id == "hold":
            _hold()

    def isolated_then_hold(model, raw, *args):
        # A big instance is checked by the worker's isolated process (service/api/isolation.py):
        # held here once that has answered.
        parsed = isolated(model, raw, *args)
        if parsed is not None and parsed.compiled().test_ids[0] == "hold":
            _hold()
        return parsed

    bodies.check_request = check_then_hold
    bodies.parsed_in_isolation = isolated_then_hold
