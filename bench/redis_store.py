"""The Redis store's session write: ``python3 -m bench.redis_store [--rounds 7] [--writes 3000]``.

Starts a fresh ``redis-server`` on a free loopback port and, in this process, writes observations
to sessions as the API does for each ``POST /v1/sessions/{id}/observations`` (``update_session``:
one compare-and-set, with the session's quota entry slid when due), round after round, in three
forms measured alternately in each round:

* **as shipped**;
* **pool's client**: every single command takes a connection from redis-py's pool and gives it
  back (``LazyClient.own`` answering the shared client), instead of the thread's own connection;
* **quota slid every write**: the session's quota entry (another slot's key) slid by every
  write instead of when half its slack has passed.

Prints the median CPU time (``time.process_time``) per write of each form and the median of the
rounds' ratios to "as shipped". The session quota is on (TENANT_MAX_SESSIONS, as by default).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.paired import print_paired  # noqa: E402

from conftest import RedisServer  # noqa: E402  (the test suite's launcher)

from service.store.base import Quotas, SessionRecord  # noqa: E402
from service.store.redis_client import LazyClient  # noqa: E402
from service.store.redis_store import RedisStore  # noqa: E402

SESSIONS = 50


def writes(store: RedisStore, count: int, prefix: str) -> float:
    """CPU seconds per ``update_session`` over ``count`` writes spread over SESSIONS sessions."""
    records = []
    for i in range(SESSIONS):
        record = SessionRecord(session_id=f"{prefix}-{i}", instance_id="i" * 64, policy="ec2", created_at=1.0)
        store.create_session(record)
        records.append(record)
    start = time.process_time()
    for k in range(count):
        i = k % SESSIONS
        record = records[i]
        records[i] = record.with_observations((*record.observations, (f"t{k}", "1")))
        store.update_session(records[i], record.version)
    return (time.process_time() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--writes", type=int, default=3000)
    args = parser.parse_args()
    shared_own = LazyClient.own
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        try:
            forms = ("as shipped", "pool's client", "quota slid every write")
            times: dict[str, list[float]] = {form: [] for form in forms}
            for r in range(args.rounds):
                for form in forms if r % 2 == 0 else reversed(forms):
                    LazyClient.own = LazyClient.get if form == "pool's client" else shared_own
                    store = RedisStore(server.url, key_prefix=f"bench{r}", quotas=Quotas(sessions=100_000))
                    if form == "quota slid every write":
                        store._quota_slack = 0.0
                    store.warm()
                    times[form].append(writes(store, args.writes, form.replace(" ", "_")))
                    store.close()
            LazyClient.own = shared_own
        finally:
            server.stop()
    print_paired("session write (update_session)", times)

if __name__ == "__main__":
    main()
