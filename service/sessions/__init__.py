"""Sessions and the instances they run on: the domain between the HTTP views and the engine.

Where each concern lives:

* ``domain.py`` — :class:`Sessions`, the one entry point the views call;
* ``steps.py`` — a step's key, its computation, and the per-worker step cache;
* ``state.py`` — a step's and a session's wire JSON;
* ``commit.py`` — the compare-and-set loop that stores an operation's new facts;
* ``observations.py``, ``corrections.py`` — the operations: record, correct, withdraw;
* ``pages.py`` — the walk through a batch of new observations, batch sessions' pages, the
  request's work deadline;
* ``idempotency.py`` — ``Idempotency-Key`` on create;
* ``exposure.py`` — restricted exposure control: the tests a session holds back and reserves,
  from counts shared by an instance's sessions;
* ``records.py`` — reading a record and its instance back from the store.
"""

from .domain import Sessions, stop_rules
from .state import SessionResult, instance_summary

__all__ = ["SessionResult", "Sessions", "instance_summary", "stop_rules"]
