"""The API layer's own cost per observation: ``python3 -m bench.api_overhead [--rounds 7] [--sessions 300]``.

In this process, through Flask's test client and the embedded (memory) store, so what is timed is
the app's per-request work with no network and no Redis: ``POST /v1/sessions/{id}/observations``
on the triage example (two answers per session; each session's first step is cached by the
step cache after the first session, as in service).

Two forms, measured alternately in each round:

* **as shipped**: ``services()`` and ``tenant()`` (service/api/context.py) read
  ``current_app.extensions`` and ``g.get`` through werkzeug's ``LocalProxy``;
* **proxies resolved once**: the same two functions resolving the proxies first with
  ``_get_current_object()`` (an attribute read through a proxy costs several times a direct
  one; this measures what that is worth per request).

Prints the median CPU time (``time.process_time``) per request of each form and the median of the
rounds' ratios to "as shipped".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.paired import print_paired  # noqa: E402

from flask import current_app, g  # noqa: E402

from api_support import TRIAGE  # noqa: E402
from service.api import context  # noqa: E402
from service.app import create_app  # noqa: E402
from service.store.base import DEFAULT_TENANT  # noqa: E402


def _services_resolved():
    return current_app._get_current_object().extensions[context.EXTENSION]


def _tenant_resolved() -> str:
    return g._get_current_object().get("tenant", DEFAULT_TENANT)


def use(services, tenant) -> None:
    """Every module of the app that imported the two functions, given these instead."""
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("service."):
            if callable(getattr(module, "services", None)):
                module.services = services
            if callable(getattr(module, "tenant", None)):
                module.tenant = tenant


def per_request(client, instance_id: str, sessions: int) -> float:
    ids = [client.post("/v1/sessions", json={"instance_id": instance_id}).get_json()["session_id"]
           for _ in range(sessions)]
    answers = [orjson.dumps({"test": "troponin", "outcome": "low"}), orjson.dumps({"test": "ecg", "outcome": "normal"})]
    start = time.process_time()
    for sid in ids:
        for body in answers:
            response = client.post(f"/v1/sessions/{sid}/observations", data=body, content_type="application/json")
            assert response.status_code == 200, response.get_data()
    return (time.process_time() - start) / (2 * sessions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sessions", type=int, default=300)
    args = parser.parse_args()
    client = create_app({"redis_url": None}).test_client()
    instance_id = client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
    shipped = (context.services, context.tenant)
    forms = {"as shipped": shipped, "proxies resolved once": (_services_resolved, _tenant_resolved)}
    per_request(client, instance_id, 50)  # warm: imports, caches, the step cache
    times: dict[str, list[float]] = {form: [] for form in forms}
    for r in range(args.rounds):
        for form in forms if r % 2 == 0 else reversed(list(forms)):
            use(*forms[form])
            times[form].append(per_request(client, instance_id, args.sessions))
    use(*shipped)
    print_paired("POST observation, in process", times)

if __name__ == "__main__":
    main()
