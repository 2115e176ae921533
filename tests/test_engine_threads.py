"""The two-thread split of big class batches: same numbers, and safe across fork (gunicorn
workers and multiprocessing pools fork processes that may already have used it)."""

import os
import signal
import time

import numpy as np
import pytest

from service import engine
from service.engine import alpha as alpha_module
from tests.builders import compile_wire


def big_classes_instance(seed: int = 0) -> engine.CompiledInstance:
    rng = np.random.default_rng(seed)
    n, n_tests = 900, 40  # ~150 rows × 40 tests per class: the big-class path
    return compile_wire({
        "tests": [{"id": f"t{t}", "outcomes": ["a", "b", "c"]} for t in range(n_tests)],
        "matrix": rng.integers(0, 3, size=(n, n_tests)).tolist(),
        "classes": [f"c{c}" for c in rng.integers(0, 6, size=n)],
        "priors": rng.uniform(0.1, 1.0, size=n).tolist(),
    })


@pytest.mark.parametrize("policy", ["ec2", "effecxtive", "infogain", "voi"])
def test_split_steps_equal_one_thread_steps(policy, monkeypatch):
    inst = big_classes_instance()
    monkeypatch.setattr(alpha_module, "_PARALLEL_CELLS", 1 << 62)
    serial = engine.next_step(inst, [], policy)  # all alive: every class is big
    monkeypatch.setattr(alpha_module, "_PARALLEL_CELLS", 0)
    split = engine.next_step(inst, [], policy)
    assert split.next_test == serial.next_test
    np.testing.assert_allclose(split.scores, serial.scores, rtol=1e-12, equal_nan=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_can_split_steps_after_its_parent_did(monkeypatch):
    monkeypatch.setattr(alpha_module, "_PARALLEL_CELLS", 0)
    inst = big_classes_instance()
    expected = engine.next_step(inst, [], "ec2").scores  # the parent's helper thread now exists
    pid = os.fork()
    if pid == 0:  # the child: an inherited executor without its thread would hang here
        ok = np.allclose(engine.next_step(inst, [], "ec2").scores, expected, equal_nan=True)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, "the child computed different scores"
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on the inherited helper thread")
