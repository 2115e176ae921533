"""A Python client for the edgecut HTTP API (docs/client.md).

Every call the API offers is safe to repeat — instances are stored under their content hash,
observations are facts keyed by test (a replay is a no-op, even under a stale ``If-Match``:
RFC 9110 §13.1.1), session creation carries an ``Idempotency-Key``, select and evaluate store
nothing — so the client retries any call after a connection error, and after 429/502/503/504
(waiting as long as ``Retry-After`` says) or 409 ``concurrent-update``. A read timeout is not
retried: the server may still be working, and a second request would only add to its load.
"""

from __future__ import annotations

import email.utils
import io
import json
import random
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from urllib.parse import quote
from datetime import timezone
from typing import TYPE_CHECKING, Any, TypeVar

import requests
from pydantic import BaseModel
from urllib3 import encode_multipart_formdata

from schemas.responses import InstanceDetail, InstanceList, InstanceListItem, SessionState, StepState

PROBLEM_TYPE_PREFIX = "urn:edgecut:problem:"
RETRIED_STATUSES = frozenset({429, 502, 503, 504})
RETRIED_CODES = frozenset({"concurrent-update"})
# Sessions whose ETag the client remembers (least recently used forgotten first).
TRACKED_SESSIONS = 10_000

if TYPE_CHECKING:
    import numpy as np

Model = TypeVar("Model", bound=BaseModel)


class EdgecutError(Exception):
    """Everything the client raises: an RFC 9457 problem answered by the service (``status``,
    ``code``, ``title``, ``detail``, ``errors``), or a request that never got an answer
    (``status`` None, the transport error as ``__cause__``). ``request_id`` is the id the
    service logged the request under: quote it when asking for support."""

    def __init__(self, detail: str, *, status: int | None = None, type: str | None = None,
                 title: str | None = None, errors: list[dict[str, str]] | None = None,
                 request_id: str | None = None, retry_after: float | None = None):
        super().__init__(detail)
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.errors = errors or []
        self.request_id = request_id
        self.retry_after = retry_after

    @property
    def code(self) -> str | None:
        """The problem type's short name, e.g. ``session-done`` for ``urn:edgecut:problem:session-done``."""
        if self.type is None:
            return None
        return self.type.removeprefix(PROBLEM_TYPE_PREFIX)

    def __str__(self) -> str:
        where = f" (request id {self.request_id})" if self.request_id else ""
        if self.status is None:
            return f"{self.detail}{where}"
        lines = [f"{self.status} {self.code or self.title or 'error'}: {self.detail}{where}"]
        lines += [f"  {error.get('path', '')}: {error.get('message', '')}" for error in self.errors]
        return "\n".join(lines)

    @classmethod
    def from_response(cls, response: requests.Response) -> EdgecutError:
        body: Any = None
        try:
            body = response.json()
        except ValueError:
            pass
        if not isinstance(body, dict):
            # Not the service's problem+json (a proxy's HTML page, say): keep a short excerpt.
            text = response.text.strip()
            body = {"detail": text[:200] or response.reason or "no detail"}
        errors = body.get("errors")
        return cls(
            str(body.get("detail") or body.get("title") or response.reason or "error"),
            status=response.status_code,
            type=body.get("type"),
            title=body.get("title"),
            errors=errors if isinstance(errors, list) else None,
            request_id=response.headers.get("X-Request-ID") or body.get("request_id"),
            retry_after=retry_after_seconds(response.headers.get("Retry-After")),
        )


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


class Client:
    """``Client("http://127.0.0.1:8000", api_key=None, timeout=30.0)``.

    ``retries``: further attempts after the first; ``backoff``: the first wait in seconds,
    doubled at each attempt (with jitter) up to ``max_backoff``; a ``Retry-After`` longer than
    ``max_retry_after`` is not waited for (the error is raised with ``retry_after`` set).
    States come back as the wire models of :mod:`schemas.responses` (fields the client does not know,
    from a newer service, are ignored)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0, *,
                 retries: int = 4, backoff: float = 0.2, max_backoff: float = 5.0,
                 max_retry_after: float = 30.0, http: requests.Session | None = None):
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._http = http or requests.Session()
        self._http.headers.update({"Accept": "application/json"})
        if api_key is not None:
            self._http.headers["Authorization"] = f"Bearer {api_key}"
        self._etags: OrderedDict[str, str] = OrderedDict()

    # --- instances --------------------------------------------------------------------------

    def create_instance(self, payload: Mapping[str, Any] | BaseModel) -> str:
        """Post an instance (a dict in the wire form, or a :class:`schemas.instance.Instance`);
        returns its id (the sha256 of its compiled content, so posting it again is harmless).
        A ``matrix`` or ``likelihood_matrix`` given as a numpy array is sent in the binary body
        (the JSON and the array's ``.npy`` bytes, docs/instances.md): no base64, no lists."""
        document, arrays = _instance_and_arrays(payload)
        if not arrays:
            return self._request("POST", "/v1/instances", body=document).json()["instance_id"]
        fields = {"instance": ("instance.json", json.dumps(document, allow_nan=False).encode(), "application/json")}
        fields.update({name: (f"{name}.npy", _npy(array), "application/octet-stream")
                       for name, array in arrays.items()})
        content = encode_multipart_formdata(fields)
        return self._request("POST", "/v1/instances", content=content).json()["instance_id"]

    def get_instance(self, instance_id: str) -> InstanceDetail:
        """The instance's summary and what ``auto`` resolves to (``.auto``), with its evidence."""
        return _parse(InstanceDetail, self._request("GET", f"/v1/instances/{instance_id}"))

    def list_instances(self, *, limit: int | None = None, cursor: str | None = None) -> InstanceList:
        """One page of this tenant's instances; pass ``next_cursor`` back for the next."""
        params = {key: str(value) for key, value in (("limit", limit), ("cursor", cursor)) if value is not None}
        return _parse(InstanceList, self._request("GET", "/v1/instances", params=params or None))

    def iter_instances(self, *, page_size: int | None = None) -> Iterator[InstanceListItem]:
        """Every instance of this tenant, page after page."""
        cursor = None
        while True:
            page = self.list_instances(limit=page_size, cursor=cursor)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def delete_instance(self, instance_id: str) -> None:
        """Delete an instance; its sessions then answer 410 ``instance-gone``. Deleting it again
        is harmless (204), so retries are safe."""
        self._request("DELETE", f"/v1/instances/{quote(instance_id, safe='')}")

    def evaluate(self, instance_id: str, **options: Any) -> dict[str, Any]:
        """``POST /v1/instances/{id}/evaluate`` with ``policies``, ``max_tests``, ``samples``, …;
        the report as a dict (docs/evaluation.md)."""
        return self._request("POST", f"/v1/instances/{instance_id}/evaluate", body=_options(options)).json()

    # --- sessions ---------------------------------------------------------------------------

    def start_session(self, instance_id: str, *, explain: bool = False, idempotency_key: str | None = None,
                      **options: Any) -> SessionState:
        """``options``: ``policy``, ``max_tests``, ``max_cost``, ``confidence``, ``seed`` (None
        leaves the service's default). One ``Idempotency-Key`` (a fresh one unless given) covers
        every retry, so a lost answer never makes a second session."""
        key = idempotency_key or f"edgecut-client-{uuid.uuid4().hex}"
        response = self._request("POST", "/v1/sessions", body={"instance_id": instance_id, **_options(options)},
                                 headers={"Idempotency-Key": key}, params=_explain(explain))
        return self._session_state(response)

    def get_session(self, session_id: str, *, explain: bool = False) -> SessionState:
        return self._session_state(self._request("GET", f"/v1/sessions/{session_id}", params=_explain(explain)))

    def observe(self, session_id: str, test: str, outcome: str, *, if_match: bool | str = True,
                explain: bool = False) -> SessionState:
        """Record one observation. ``if_match``: True sends the session's last seen ETag (412
        ``precondition-failed`` then means someone else changed the session: read it again),
        False sends none, a string sends that tag."""
        return self.observe_many(session_id, [{"test": test, "outcome": outcome}], if_match=if_match,
                                 explain=explain)

    def observe_many(self, session_id: str, observations: Iterable[tuple[str, str] | Mapping[str, Any]], *,
                     if_match: bool | str = True, explain: bool = False) -> SessionState:
        """Record several observations in order, all or nothing: ``(test, outcome)`` pairs or
        dicts in the wire form."""
        items = [dict(o) if isinstance(o, Mapping) else {"test": o[0], "outcome": o[1]} for o in observations]
        if not items:
            raise ValueError("observe_many needs at least one observation")
        body: dict[str, Any] = items[0] if len(items) == 1 else {"observations": items}
        response = self._request("POST", f"/v1/sessions/{session_id}/observations", body=body,
                                 headers=self._if_match(session_id, if_match), params=_explain(explain))
        return self._session_state(response)

    def skip(self, session_id: str, test: str, *, if_match: bool | str = True, explain: bool = False) -> SessionState:
        """The respondent will not answer ``test``: it is never proposed again, nothing is learnt
        (docs/api.md). Re-posting the same skip is a no-op, like an observation."""
        return self.observe_many(session_id, [{"test": test, "skip": True}], if_match=if_match, explain=explain)

    def correct(self, session_id: str, test: str, outcome: str, *, occurrence: int | None = None,
                if_match: bool | str = True, explain: bool = False) -> SessionState:
        """Replace the recorded outcome of ``test`` (``occurrence``: which answer of a
        repeatable test, from 1). Idempotent: a retry puts the same fact again."""
        return self._session_state(self._request(
            "PUT", f"/v1/sessions/{session_id}/observations/{quote(test, safe='')}", body={"outcome": outcome},
            headers=self._if_match(session_id, if_match), params=_occurrence(occurrence, explain)))

    def withdraw(self, session_id: str, test: str, *, occurrence: int | None = None, if_match: bool | str = True,
                 explain: bool = False) -> SessionState:
        """Withdraw the recorded answer to ``test``; the session is recomputed from the rest. A
        retry whose first attempt landed finds nothing left to withdraw (404); for a repeatable
        test's ``occurrence`` the ETag sent as ``If-Match`` (the default) makes it 412 instead."""
        return self._session_state(self._request(
            "DELETE", f"/v1/sessions/{session_id}/observations/{quote(test, safe='')}",
            headers=self._if_match(session_id, if_match), params=_occurrence(occurrence, explain)))

    def delete_session(self, session_id: str, *, if_match: bool | str = False) -> None:
        """Delete a session. A retry that finds it already gone (an earlier attempt deleted it
        but its answer was lost) counts as done."""
        self._request("DELETE", f"/v1/sessions/{session_id}", headers=self._if_match(session_id, if_match),
                      gone_after_retry_is_done=True)
        self._etags.pop(session_id, None)

    def etag(self, session_id: str) -> str | None:
        """The ETag of the last state of this session the client saw (``None`` if none)."""
        return self._etags.get(session_id)

    # --- stateless --------------------------------------------------------------------------

    def select(self, instance_id: str | None = None, observations: Iterable[tuple[str, str] | Mapping[str, Any]] = (),
               *, instance: Mapping[str, Any] | BaseModel | None = None, explain: bool = False,
               **options: Any) -> StepState:
        """``POST /v1/select``: the next step for observations the caller keeps itself (by
        ``instance_id``, or an inline ``instance``); nothing is stored."""
        body: dict[str, Any] = {"instance_id": instance_id} if instance is None else {"instance": _json_instance(instance)}
        body["observations"] = [dict(o) if isinstance(o, Mapping) else {"test": o[0], "outcome": o[1]}
                                for o in observations]
        body.update(_options(options))
        return _parse(StepState, self._request("POST", "/v1/select", body=body, params=_explain(explain)))

    # --- plumbing ---------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _if_match(self, session_id: str, if_match: bool | str) -> dict[str, str]:
        if isinstance(if_match, str):
            return {"If-Match": if_match}
        tag = self._etags.get(session_id) if if_match else None
        return {"If-Match": tag} if tag else {}

    def _session_state(self, response: requests.Response) -> SessionState:
        state = _parse(SessionState, response)
        tag = response.headers.get("ETag")
        if tag:
            self._etags[state.session_id] = tag
            self._etags.move_to_end(state.session_id)
            while len(self._etags) > TRACKED_SESSIONS:
                self._etags.popitem(last=False)
        return state

    def _request(self, method: str, path: str, *, body: Any = None, content: tuple[bytes, str] | None = None,
                 headers: Mapping[str, str] | None = None, params: Mapping[str, str] | None = None,
                 gone_after_retry_is_done: bool = False) -> requests.Response:
        """``body``: JSON to send; ``content``: bytes already encoded, with their media type."""
        # One request id for every attempt, so the service's logs tie the retries together.
        sent = {"X-Request-ID": uuid.uuid4().hex, **(headers or {})}
        data = None
        if body is not None:
            content = (json.dumps(body, allow_nan=False).encode(), "application/json")
        if content is not None:
            data, sent["Content-Type"] = content
        lost_answer = False
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, self.base_url + path, data=data, headers=sent, params=params,
                                              timeout=self.timeout)
            except requests.Timeout as error:
                if isinstance(error, requests.ConnectTimeout) and not last:
                    self._sleep(self._backoff(attempt))
                    continue
                raise EdgecutError(f"{method} {path}: no answer within {self.timeout} s",
                                   request_id=sent["X-Request-ID"]) from error
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as error:
                # Refused, reset, or cut off mid-answer (a worker killed while it wrote).
                if last:
                    raise EdgecutError(f"{method} {path}: cannot reach {self.base_url} "
                                       f"after {attempt + 1} attempts: {error}", request_id=sent["X-Request-ID"]) from error
                lost_answer = True  # the service may have acted on it
                self._sleep(self._backoff(attempt))
                continue
            if response.status_code < 400:
                return response
            problem = EdgecutError.from_response(response)
            if gone_after_retry_is_done and lost_answer and response.status_code == 404:
                return response
            wait = self._wait_before_retry(problem, attempt)
            if wait is None or last:
                raise problem
            self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_before_retry(self, problem: EdgecutError, attempt: int) -> float | None:
        if problem.status not in RETRIED_STATUSES and problem.code not in RETRIED_CODES:
            return None
        if problem.retry_after is None:
            return self._backoff(attempt)
        if problem.retry_after > self.max_retry_after:
            return None
        return problem.retry_after

    def _backoff(self, attempt: int) -> float:
        # Jitter spreads the retries of many clients that failed at the same moment.
        return min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)

    @staticmethod
    def _sleep(seconds: float) -> None:
        time.sleep(seconds)


ARRAY_FIELDS = ("matrix", "likelihood_matrix")


def _instance_and_arrays(payload: Mapping[str, Any] | BaseModel) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The instance's JSON form without its numpy arrays, and those arrays by field."""
    # A payload can hold an array only once numpy is imported: a client that sends none never
    # loads numpy (~0.3 s of import).
    numpy = sys.modules.get("numpy")
    ndarray = numpy.ndarray if numpy is not None else ()
    if isinstance(payload, BaseModel):
        arrays = {name: getattr(payload, name) for name in ARRAY_FIELDS
                  if isinstance(getattr(payload, name, None), ndarray)}
        document = payload.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude=set(arrays))
        return document, arrays
    arrays = {name: payload[name] for name in ARRAY_FIELDS if isinstance(payload.get(name), ndarray)}
    return {name: value for name, value in payload.items() if name not in arrays}, arrays


def _json_instance(payload: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    """An inline instance as JSON: numpy arrays in the compact base64 form."""
    document, arrays = _instance_and_arrays(payload)
    if not arrays:
        return document
    from schemas.arrays import encode

    return {**document, **{name: encode(array) for name, array in arrays.items()}}


def _npy(array: np.ndarray) -> bytes:
    import numpy as np

    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in options.items() if value is not None}


def _occurrence(occurrence: int | None, explain: bool) -> dict[str, str] | None:
    params = {**(_explain(explain) or {}), **({"occurrence": str(occurrence)} if occurrence is not None else {})}
    return params or None


def _explain(explain: bool) -> dict[str, str] | None:
    return {"explain": "true"} if explain else None


def _parse(model: type[Model], response: requests.Response) -> Model:
    return model.model_validate(response.json(), extra="ignore")


__all__ = ["Client", "EdgecutError", "retry_after_seconds"]
