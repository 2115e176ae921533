"""The gunicorn worker: gthread, except that a request is read whole by the worker's event loop
before any thread sees it (``worker_class`` in service/gunicorn_conf.py).

gthread hands a connection to a thread as soon as it is readable, and that thread then blocks in
``recv`` until the client has sent the rest of its headers and body. Sixteen clients that send
headers and ``Content-Length: 100000`` and then stall take every thread of 2 workers × 8 threads,
and ``/healthz`` stops answering. Here the event loop buffers each request without blocking
(the way nginx buffers bodies in front of an application server) and submits it only when
complete, so a thread only ever runs a request whose bytes are all in memory:

* a request not complete ``REQUEST_READ_TIMEOUT`` seconds after its first byte could be read is
  answered ``408 request-timeout`` and closed (a connection that sent nothing is just closed);
* the bytes buffered by one worker are bounded by ``REQUEST_BUFFER_BYTES``; a request that would
  go past it is answered ``503 server-busy`` with ``Retry-After``;
* a body announced or found larger than ``MAX_BODY_BYTES`` (``Content-Length``, or the chunks
  received so far) is answered ``413 body-too-large`` at once;
* framing that can never become a valid request (a bad ``Content-Length``, both
  ``Content-Length`` and ``Transfer-Encoding``, a malformed chunk) is answered 400 at once, and
  headers longer than gunicorn's limits allow 431.

A new worker keeps a heap faulted in (service/heap.py), rehearses the engine once and waits
briefly for a thread of its own to open the store's connections (service/app.py ``rehearse``,
``warm_up``) before serving, so its first request pays for none of them; none of it can fail
the worker.

Everything gunicorn itself refuses (a 414 request line, a control character in a header, …) is
answered in RFC 9457 problem+json like the application's own errors, never gunicorn's HTML page.
TLS and HTTP/2 connections are served as by gthread.
"""

from __future__ import annotations

import collections
import io
import re
import selectors
import threading
import time
from functools import partial

from gunicorn.http import errors as http_errors
from gunicorn.http.body import LengthReader
from gunicorn.http.unreader import SocketUnreader
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import ThreadWorker

from schemas.api import Problem
from service.api.encoding import dumps
from service.api.problems import PROBLEM_MEDIA_TYPE, PROBLEMS, TYPE_PREFIX
from service.app import rehearse, warm_up
from service.heap import reserve_heap
from service.settings import load_settings

RECV_BYTES = 1024 * 1024
WARM_UP_WAIT = 0.5  # seconds a new worker waits for its store's connections before serving
# gunicorn's header limits may be 0 ("unlimited"); the buffer still needs a bound.
UNLIMITED_HEADER_BYTES = 1024 * 1024
MAX_CHUNK_SIZE_LINE = 1024
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(rb"[0-9]{1,19}")


class Framing:
    """Where one HTTP/1.1 request ends in the bytes received so far (RFC 9112 §6).

    Only the framing is read (the end of the headers, ``Content-Length``, ``Transfer-Encoding:
    chunked`` and the chunk sizes); everything else is left to gunicorn's parser. Scanning is
    incremental: each call to :meth:`verdict` continues where the last one stopped, so a body
    arriving in many small pieces costs linear time."""

    INCOMPLETE, COMPLETE, TOO_LARGE, MALFORMED, HEADERS_TOO_LARGE = (
        "incomplete", "complete", "too-large", "malformed", "headers-too-large")

    def __init__(self, max_header_bytes: int, max_body_bytes: int):
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self._buffer = bytearray()
        # Once a Content-Length body is under way, what arrives is kept as pieces and joined once
        # (bytearray += copies the whole buffer again and again as it grows: ~8 times in all).
        self._tail: list[bytes] | None = None
        self.size = 0  # bytes received
        self.reason = ""
        self.expects_continue = False
        self._searched = 0  # bytes searched for the end of the headers
        self._body_start: int | None = None
        self._content_length: int | None = None
        self._chunked = False
        self._cursor = 0  # chunked: where the next chunk-size line starts
        self._body_bytes = 0  # chunked: data bytes seen so far
        self._final: str | None = None

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self._tail is None:
            self._buffer += data
        else:
            self._tail.append(data)

    @property
    def data(self) -> bytes | bytearray:
        """Everything received so far."""
        if self._tail:
            self._buffer = b"".join([self._buffer, *self._tail])
            self._tail = []
        return self._buffer

    def pieces(self) -> list:
        """Everything received so far, as the buffers it arrived in (not joined), the headers
        apart from the body: gunicorn's parser then reads the headers alone."""
        head = [self._buffer]
        if self._body_start is not None:
            view = memoryview(self._buffer)
            head = [view[:self._body_start], view[self._body_start:]]
        return [*head, *(self._tail or ())]

    def body(self) -> bytes | None:
        """A complete ``Content-Length`` body, joined once from the pieces it arrived in; None
        for any other framing (chunked, no length, empty)."""
        if self._final != self.COMPLETE or self._chunked or not self._content_length:
            return None
        parts, wanted = [], self._content_length
        for piece in self.pieces()[1:]:  # after the headers: the body, then what came after it
            view = memoryview(piece)[:wanted]
            if view.nbytes:
                parts.append(view)
                wanted -= view.nbytes
        return b"".join(parts)

    @property
    def has_body_pending(self) -> bool:
        """Headers read, body not complete yet (for ``Expect: 100-continue``)."""
        return self._body_start is not None and self._final is None

    def verdict(self) -> str:
        if self._final is not None:
            return self._final
        if self._body_start is None:
            state = self._headers()
            if state != self.COMPLETE:
                return self._settle(state)
        if self._chunked:
            return self._settle(self._chunks())
        if self._content_length is None:
            return self._settle(self.COMPLETE)
        if self._content_length > self.max_body_bytes:
            return self._settle(self.TOO_LARGE)
        if self._tail is None:
            self._tail = []
        done = self.size - self._body_start >= self._content_length
        return self._settle(self.COMPLETE if done else self.INCOMPLETE)

    def _settle(self, state: str) -> str:
        if state != self.INCOMPLETE:
            self._final = state
        return state

    def _headers(self) -> str:
        start = max(0, self._searched - 3)
        end = self.data.find(b"\r\n\r\n", start)
        if end < 0:
            bare = self.data.find(b"\n\n", start)  # bare LF: let gunicorn's parser refuse it
            if bare >= 0:
                self._body_start = bare + 2
                return self.COMPLETE
            self._searched = len(self.data)
            if len(self.data) > self.max_header_bytes:
                self.reason = f"the request's headers are longer than {self.max_header_bytes} bytes"
                return self.HEADERS_TOO_LARGE
            return self.INCOMPLETE
        self._body_start = end + 4
        lengths, codings = [], []
        for line in bytes(self.data[:end]).split(b"\r\n")[1:]:
            name, sep, value = line.partition(b":")
            name = name.lower()
            if not sep:
                continue  # not a header field: gunicorn's parser refuses the request
            if name == b"content-length":
                lengths.append(value.strip())
            elif name == b"transfer-encoding":
                codings += [c.strip().lower() for c in value.split(b",")]
            elif name == b"expect" and value.strip().lower() == b"100-continue":
                self.expects_continue = True
        if lengths and codings:
            self.reason = "the request has both Content-Length and Transfer-Encoding"
            return self.MALFORMED
        if codings:
            if codings != [b"chunked"]:
                self.reason = "the only transfer coding accepted is chunked"
                return self.MALFORMED
            self._chunked = True
            self._cursor = self._body_start
            return self.COMPLETE
        if lengths:
            if len(set(lengths)) != 1 or not _DIGITS.fullmatch(lengths[0]):
                self.reason = "Content-Length must be one non-negative decimal integer"
                return self.MALFORMED
            self._content_length = int(lengths[0])
        return self.COMPLETE

    def _chunks(self) -> str:
        data = self.data
        while True:
            line_end = data.find(b"\r\n", self._cursor, self._cursor + MAX_CHUNK_SIZE_LINE)
            if line_end < 0:
                if len(data) - self._cursor >= MAX_CHUNK_SIZE_LINE:
                    self.reason = "a chunk-size line is too long"
                    return self.MALFORMED
                return self.INCOMPLETE
            size_text = bytes(data[self._cursor:line_end]).split(b";", 1)[0].strip(b" \t")
            if not _HEX.fullmatch(size_text):
                self.reason = "a chunk size is not a hexadecimal number"
                return self.MALFORMED
            size = int(size_text, 16)
            data_start = line_end + 2
            if size == 0:
                # The trailer section ends with an empty line (usually right away).
                if len(data) - data_start >= 2 and data[data_start:data_start + 2] == b"\r\n":
                    return self.COMPLETE
                if data.find(b"\r\n\r\n", data_start) >= 0:
                    return self.COMPLETE
                if len(data) - data_start > self.max_header_bytes:
                    self.reason = f"the trailers are longer than {self.max_header_bytes} bytes"
                    return self.HEADERS_TOO_LARGE
                return self.INCOMPLETE
            if self._body_bytes + size > self.max_body_bytes:
                return self.TOO_LARGE
            if len(data) < data_start + size + 2:
                return self.INCOMPLETE
            if data[data_start + size:data_start + size + 2] != b"\r\n":
                self.reason = "a chunk does not end with CRLF"
                return self.MALFORMED
            self._body_bytes += size
            self._cursor = data_start + size + 2


def problem_message(code: str, detail: str, headers: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 response carrying the problem ``code`` (service/api/problems.py's
    table), closing the connection: what is left on it cannot be trusted to be a request."""
    status, title, _ = PROBLEMS[code]
    body = dumps(Problem(type=TYPE_PREFIX + code, title=title, status=status, detail=detail, errors=None)
                 .model_dump(exclude_none=True))
    lines = [f"HTTP/1.1 {status} {title}", f"Content-Type: {PROBLEM_MEDIA_TYPE}", f"Content-Length: {len(body)}",
             "Connection: close", "Cache-Control: no-store", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# gunicorn's parse errors → (problem code, detail shown). The detail is gunicorn's own message,
# cut short: it quotes at most a few bytes of what the client sent.
def _refusal(exc: BaseException) -> tuple[str, str]:
    e = http_errors
    if isinstance(exc, (e.ConfigurationProblem, e.InvalidResponseHeader, e.InvalidResponseHeaderName)):
        return "internal-error", "an unexpected error occurred; it has been logged"  # ours, not the client's
    if isinstance(exc, e.LimitRequestLine):
        return "uri-too-long", f"the request line is too long: {exc}"
    if isinstance(exc, e.LimitRequestHeaders):
        return "headers-too-large", f"the request's headers are too large: {exc}"
    if isinstance(exc, e.UnsupportedTransferCoding):
        return "unsupported-transfer-coding", str(exc)
    if isinstance(exc, e.ExpectationFailed):
        return "expectation-failed", str(exc)
    if isinstance(exc, (e.ParseException, UnicodeError)):
        return "bad-request", f"the request is not valid HTTP/1.1: {exc}"
    return "internal-error", "an unexpected error occurred; it has been logged"


class HeldUnreader(SocketUnreader):
    """gunicorn's socket unreader, holding what is pushed back to it (the request the event loop
    buffered, what the parser did not consume) as views, in order, before the socket.

    gunicorn's own keeps them in a BytesIO and rewrites everything after the bytes it returns on
    every read: its body reader asks for 1 MiB at a time, so a 13 MB body buffered whole was
    copied ~13 times over (~0.1 s). Here each byte is copied once, when it is read."""

    def __init__(self, source: SocketUnreader):
        super().__init__(source.sock, source.mxchunk)
        self._held: collections.deque[memoryview] = collections.deque()
        self.unread(source.take_buffered())

    def unread(self, data) -> None:
        if len(data):
            self._held.appendleft(memoryview(data).cast("B"))

    def read(self, size=None, read_ahead=None):
        if not self._held or size == 0:
            return super().read(size, read_ahead)
        if size is not None and not isinstance(size, int):
            raise TypeError("size parameter must be an int or long.")
        # No size: the next piece (at most RECV_BYTES), as a socket read would give one; the
        # parser reads headers so, and they are a piece of their own.
        if size is None or size < 0:
            return bytes(self._take(RECV_BYTES))
        wanted, pieces = size, []
        while wanted and self._held:
            pieces.append(self._take(wanted))
            wanted -= len(pieces[-1])
        data = b"".join(pieces)
        if wanted:
            data += super().read(wanted, read_ahead)
        return data

    def skip(self, size: int) -> None:
        """Drop the next ``size`` held bytes unread (a body handed to the request another way)."""
        while size and self._held:
            size -= len(self._take(size))

    def _take(self, limit: int) -> memoryview:
        """At most ``limit`` bytes of the next held piece, the rest of it held back."""
        piece = self._held.popleft()
        if len(piece) > limit:
            self._held.appendleft(piece[limit:])
            piece = piece[:limit]
        return piece

    def take_buffered(self):
        held = b"".join(self._held)
        self._held.clear()
        return held + super().take_buffered()

    @property
    def holds_data(self) -> bool:
        """Bytes received and not read yet (a pipelined request, say)."""
        return bool(self._held) or bool(self.buf.getvalue())


class _Pending:
    __slots__ = ("conn", "framing", "deadline", "announced_continue")

    def __init__(self, conn, framing: Framing, deadline: float):
        self.conn = conn
        self.framing = framing
        self.deadline = deadline
        self.announced_continue = False


class BufferingWorker(ThreadWorker):
    """gthread with whole requests buffered by the event loop (see the module docstring)."""

    def init_process(self):
        settings = load_settings()
        self.read_timeout = settings.request_read_timeout
        self.buffer_budget = settings.request_buffer_bytes
        self.max_body_bytes = settings.max_body_bytes
        self.retry_after = settings.retry_after_seconds
        cfg = self.cfg
        if cfg.limit_request_line and cfg.limit_request_fields and cfg.limit_request_field_size:
            self.max_header_bytes = (cfg.limit_request_line + 2
                                     + cfg.limit_request_fields * (cfg.limit_request_field_size + 2) + 2)
        else:
            self.max_header_bytes = UNLIMITED_HEADER_BYTES
        # Insertion order is deadline order (every request gets the same timeout).
        self.buffering: dict[object, _Pending] = {}
        self.buffered_bytes = 0
        reserve_heap(settings.worker_heap_reserve_bytes)  # before any thread starts
        super().init_process()  # runs the worker; must come last

    def load_wsgi(self):
        super().load_wsgi()
        rehearse()  # before the worker serves: a request arriving meanwhile would compete with it
        # On a thread of its own, waited for up to WARM_UP_WAIT: a first request arriving while
        # the store's connections were still being opened raced them (a cold 10⁴ × 10³ first step
        # 2.05× a warm one instead of 1.7×), and a worker must still boot while Redis does not
        # answer (its connect timeout is as long again). Not on the request pool, whose first
        # thread then serves the first requests as it would without it.
        warming = threading.Thread(target=warm_up, args=(self.wsgi,), name="edgecut-warm-up", daemon=True)
        warming.start()
        warming.join(WARM_UP_WAIT)

    # --- buffering in the event loop ----------------------------------------------------------

    def _bufferable(self, conn) -> bool:
        return not (self.cfg.is_ssl or conn.is_http2 or negotiation.prior_knowledge_allowed(self.cfg, conn.client))

    def finish_request(self, conn, fs):
        # gthread serves a kept-alive connection's next request at once when its bytes were
        # already read with the last one (a pipelining client), but looks for them in its own
        # unreader's buffer only: the held unreader keeps them elsewhere.
        try:
            keep_alive = not fs.cancelled() and fs.result() is True
        except Exception:
            keep_alive = False
        unreader = conn.parser.unreader if keep_alive and conn.parser is not None else None
        if isinstance(unreader, HeldUnreader) and unreader.holds_data:
            self.enqueue_req(conn)
            return
        super().finish_request(conn, fs)

    def enqueue_req(self, conn):
        if not self._bufferable(conn):
            return super().enqueue_req(conn)
        pending = _Pending(conn, Framing(self.max_header_bytes, self.max_body_bytes),
                           time.monotonic() + self.read_timeout)
        if conn.parser is not None:  # a kept-alive connection: bytes read ahead of the last request
            early = conn.parser.unreader.take_buffered()
            pending.framing.feed(early)
            self.buffered_bytes += len(early)
        if self._advance(pending):
            return
        conn.sock.setblocking(False)
        self.buffering[conn] = pending
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, pending))

    def _on_readable(self, pending: _Pending, sock) -> None:
        try:
            data = sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._park_end(pending)
            self._close(pending)
            return
        if self.buffered_bytes + len(data) > self.buffer_budget:
            self._park_end(pending)
            self._refuse(pending, "server-busy", "the server is receiving too many requests at once; retry shortly",
                         {"Retry-After": str(self.retry_after)})
            return
        pending.framing.feed(data)
        self.buffered_bytes += len(data)
        if pending.framing.verdict() != Framing.INCOMPLETE:
            self._park_end(pending)
        self._advance(pending)

    def _advance(self, pending: _Pending) -> bool:
        """Submit, refuse, or keep waiting; True when the connection left the event loop."""
        framing = pending.framing
        verdict = framing.verdict()
        if verdict == Framing.INCOMPLETE:
            if framing.expects_continue and framing.has_body_pending and not pending.announced_continue:
                # The client waits for this before sending its body (RFC 9110 §10.1.1).
                pending.announced_continue = True
                try:
                    pending.conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                except OSError:
                    pass
            return False
        if verdict == Framing.MALFORMED:
            self._refuse(pending, "bad-request", f"the request's framing is malformed: {framing.reason}")
        elif verdict == Framing.HEADERS_TOO_LARGE:
            self._refuse(pending, "headers-too-large", framing.reason)
        elif verdict == Framing.TOO_LARGE:
            self._refuse(pending, "body-too-large",
                         f"the body exceeds the limit of {self.max_body_bytes} bytes (MAX_BODY_BYTES)")
        else:
            self._submit(pending)
        return True

    def _submit(self, pending: _Pending) -> None:
        conn = pending.conn
        self.buffered_bytes -= pending.framing.size
        conn.init()  # the parser (once per connection), reading from the socket
        if not isinstance(conn.parser.unreader, HeldUnreader):
            conn.parser.unreader = HeldUnreader(conn.parser.unreader)
        for piece in reversed(pending.framing.pieces()):  # held as they came, not copied
            conn.parser.unreader.unread(piece)
        conn.held_body = pending.framing.body()
        conn.data_ready = True
        super().enqueue_req(conn)

    def handle_request(self, req, conn):
        body, conn.held_body = getattr(conn, "held_body", None), None
        # The body the event loop holds, handed to the application as the one bytes object it
        # was joined into: gunicorn's body reader would copy it three times more (the held
        # pieces, its BytesIO, the BytesIO's value). The same bytes held for the parser are dropped.
        if (body is not None and req.body is not None and type(req.body.reader) is LengthReader
                and req.body.reader.length == len(body)):
            conn.parser.unreader.skip(len(body))
            req.body = io.BytesIO(body)  # read() of the whole returns ``body`` itself
        return super().handle_request(req, conn)

    def handle_h2c_upgrade(self, conn, req, settings):
        conn.held_body = None  # gunicorn reads this body itself, from the parser's copy
        return super().handle_h2c_upgrade(conn, req, settings)

    def _park_end(self, pending: _Pending) -> None:
        if self.buffering.pop(pending.conn, None) is not None:
            try:
                self.poller.unregister(pending.conn.sock)
            except (KeyError, ValueError, OSError):
                pass

    def _refuse(self, pending: _Pending, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        self.log.info("refused a request from %s: %s (%s)", pending.conn.client[0] if pending.conn.client else "?",
                      code, detail)
        try:
            pending.conn.sock.setblocking(False)
            pending.conn.sock.send(problem_message(code, detail, headers))
        except OSError:
            pass
        self._close(pending)

    def _close(self, pending: _Pending) -> None:
        self.buffered_bytes -= pending.framing.size
        self.nr_conns -= 1
        pending.conn.close()

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        while self.buffering:
            pending = next(iter(self.buffering.values()))
            if pending.deadline > now:
                break
            self._park_end(pending)
            if pending.framing.size:
                self._refuse(pending, "request-timeout",
                             f"the request was not received within {self.read_timeout:g} s (REQUEST_READ_TIMEOUT)")
            else:
                self._close(pending)

    # --- gunicorn's own refusals, as problems ---------------------------------------------------

    def handle_error(self, req, client, addr, exc):
        code, detail = _refusal(exc)
        if code == "internal-error":
            self.log.exception("error handling a request")
        else:
            self.log.info("refused a request from %s: %s", (addr or ("?",))[0], exc)
        try:
            client.setblocking(False)
            client.send(problem_message(code, detail[:300]))
        except OSError:
            pass
