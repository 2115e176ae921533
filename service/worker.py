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
  headers longer than gunicorn's limits allow 431. Where a request ends is read by llhttp (the
  parser of Node.js, through httptools), strict, never by hand;
* past ``worker_connections`` the connection idle longest (kept alive, or silent since it was
  accepted) is closed to make room, and while every connection is in the middle of a request a
  new one is answered ``503 server-busy`` at once, so idle connections never stall others.

The event loop sends ``100 Continue`` to a client that waits for it; gunicorn's own is then
suppressed (one interim response per request). The worker uses gunicorn's gthread internals
(``TConn``, ``nr_conns``, ``murder_pending``, the unreader): pyproject.toml pins gunicorn to the
major version it is tested on.

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
import errno
import io
import selectors
import socket
import threading
import time
from functools import partial

import httptools
from gunicorn.http import errors as http_errors
from gunicorn.http.body import LengthReader
from gunicorn.http.unreader import SocketUnreader
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import ThreadWorker

from schemas.api import Problem
from service.api.encoding import dumps
from service.api.problems import PROBLEM_MEDIA_TYPE, PROBLEMS, TYPE_PREFIX
from service.app import rehearse, warm_up
from service.heap import reserve_heap, resident_bytes, trim_heap
from service.settings import load_settings

RECV_BYTES = 1024 * 1024
WARM_UP_WAIT = 0.5  # seconds a new worker waits for its store's connections before serving
# An idle worker this far above its size at boot gives its heap's free pages back.
IDLE_EXCESS_BYTES = 128 * 1024 * 1024
IDLE_CHECK_INTERVAL = 1.0  # seconds
# gunicorn's header limits may be 0 ("unlimited"); the buffer still needs a bound.
UNLIMITED_HEADER_BYTES = 1024 * 1024


class _HeadReader:
    """llhttp's callbacks for one request: what framing needs from the head (the body's length or
    chunked coding, ``Expect``), and the chunked body's size as it is decoded. A message after
    this one (pipelined) is not looked at: gunicorn's parser reads it in its turn."""

    __slots__ = ("max_body_bytes", "content_length", "codings", "expects_continue", "headers_complete",
                 "message_complete", "body_bytes", "too_large")

    def __init__(self, max_body_bytes: int):
        self.max_body_bytes = max_body_bytes
        self.content_length: int | None = None
        self.codings: list[bytes] = []
        self.expects_continue = False
        self.headers_complete = False
        self.message_complete = False
        self.body_bytes = 0
        self.too_large = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.headers_complete:  # a trailer, or the next message's head
            return
        name = name.lower()
        if name == b"content-length":
            self.content_length = int(value)  # llhttp accepts digits only, and one value
        elif name == b"transfer-encoding":
            self.codings += [coding.strip().lower() for coding in value.split(b",")]
        elif name == b"expect" and value.strip().lower() == b"100-continue":
            self.expects_continue = True

    def on_headers_complete(self) -> None:
        self.headers_complete = True

    def on_body(self, data: bytes) -> None:  # chunked bodies only: a Content-Length one is not fed
        if self.message_complete:
            return
        self.body_bytes += len(data)
        if self.body_bytes > self.max_body_bytes:
            self.too_large = True
            raise OverflowError("MAX_BODY_BYTES")  # stops llhttp

    def on_message_complete(self) -> None:
        self.message_complete = True


class Framing:
    """Where one HTTP/1.1 request ends in the bytes received so far (RFC 9112 §6), as llhttp (via
    httptools) reads it; everything else is left to gunicorn's parser, which reads the same bytes.

    llhttp gets the head once it is all there (up to the first empty line: a valid head holds no
    other), then a chunked body as it arrives. A ``Content-Length`` body is not fed to it (it would
    only be copied out again): it is complete when that many bytes followed the head. Each call to
    :meth:`verdict` continues where the last one stopped, so a body arriving in many small pieces
    costs linear time. Beyond llhttp's own refusals, the one policy here: ``chunked`` is the only
    transfer coding accepted."""

    INCOMPLETE, COMPLETE, TOO_LARGE, MALFORMED, HEADERS_TOO_LARGE = (
        "incomplete", "complete", "too-large", "malformed", "headers-too-large")

    def __init__(self, max_header_bytes: int, max_body_bytes: int):
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self._head = bytearray()  # what arrived before the head was complete
        # After it, what arrives is kept as the pieces it came in and joined at most once
        # (bytearray += copies the whole buffer again and again as it grows).
        self._tail: list = []
        self._fed = 0  # pieces of the tail given to llhttp (chunked)
        self.size = 0  # bytes received
        self.reason = ""
        self._searched = 0  # bytes searched for the end of the head
        self._head_fed = 0  # bytes of it given to llhttp
        self._body_start: int | None = None
        self._reader = _HeadReader(max_body_bytes)
        self._parser = httptools.HttpRequestParser(self._reader)
        self._final: str | None = None

    @property
    def expects_continue(self) -> bool:
        return self._reader.expects_continue

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self._body_start is None:
            self._head += data
        else:
            self._tail.append(data)

    def pieces(self) -> list:
        """Everything received so far, as the buffers it arrived in (not joined), the head apart
        from the body: gunicorn's parser then reads the head alone."""
        if self._body_start is None:
            return [self._head, *self._tail]
        return [memoryview(self._head)[:self._body_start], *self._tail]

    def body(self) -> bytes | None:
        """A complete ``Content-Length`` body, joined once from the pieces it arrived in; None
        for any other framing (chunked, no length, empty)."""
        if self._final != self.COMPLETE or self._chunked or not self._reader.content_length:
            return None
        parts, wanted = [], self._reader.content_length
        for piece in self._tail:  # after the head: the body, then what came after it
            view = memoryview(piece)[:wanted]
            if view.nbytes:
                parts.append(view)
                wanted -= view.nbytes
        return b"".join(parts)

    @property
    def has_body_pending(self) -> bool:
        """Head read, body not complete yet (for ``Expect: 100-continue``)."""
        return self._body_start is not None and self._final is None

    @property
    def _chunked(self) -> bool:
        return bool(self._reader.codings)

    def verdict(self) -> str:
        if self._final is not None:
            return self._final
        if self._body_start is None:
            state = self._read_head()
            if state != self.COMPLETE:
                return self._settle(state)
        reader = self._reader
        if self._chunked:
            return self._settle(self._read_chunks())
        if reader.content_length is None:
            return self._settle(self.COMPLETE)
        if reader.content_length > self.max_body_bytes:
            return self._settle(self.TOO_LARGE)
        done = self.size - self._body_start >= reader.content_length
        return self._settle(self.COMPLETE if done else self.INCOMPLETE)

    def _settle(self, state: str) -> str:
        if state != self.INCOMPLETE:
            self._final = state
        return state

    def _read_head(self) -> str:
        # llhttp reads the head as it arrives (a malformed one is refused at once), never past
        # its end: what follows is the body, or the next request.
        end = self._head.find(b"\r\n\r\n", max(0, self._searched - 3))
        self._searched = len(self._head)
        upto = len(self._head) if end < 0 else end + 4
        state = self._parse(memoryview(self._head)[self._head_fed:upto])
        self._head_fed = upto
        if state == self.MALFORMED:
            return state
        if end < 0:
            if len(self._head) > self.max_header_bytes:
                self.reason = f"the request's headers are longer than {self.max_header_bytes} bytes"
                return self.HEADERS_TOO_LARGE
            return self.INCOMPLETE
        self._body_start = upto
        rest = memoryview(self._head)[upto:]
        if rest.nbytes:
            self._tail.append(rest)
        if not self._reader.headers_complete:
            self.reason = "the request's head is not valid HTTP/1.1"
            return self.MALFORMED
        if self._chunked and self._reader.codings != [b"chunked"]:
            self.reason = "the only transfer coding accepted is chunked"
            return self.MALFORMED
        return self.COMPLETE

    def _read_chunks(self) -> str:
        while self._fed < len(self._tail) and not self._reader.message_complete:
            piece = self._tail[self._fed]
            self._fed += 1
            state = self._parse(piece if isinstance(piece, memoryview) else memoryview(piece))
            if state != self.COMPLETE:
                return state
        return self.COMPLETE if self._reader.message_complete else self.INCOMPLETE

    def _parse(self, data: memoryview) -> str:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._chunked:  # llhttp reads no body after an upgrade
                self.reason = "a request asking to upgrade the connection cannot have a chunked body"
                return self.MALFORMED
        except httptools.HttpParserError as error:
            if self._reader.too_large:
                return self.TOO_LARGE
            if not self._reader.message_complete:  # else: the next (pipelined) message's fault
                self.reason = str(error)
                return self.MALFORMED
        return self.COMPLETE


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


def _bytes_waiting(sock) -> bool:
    """Bytes received for a non-blocking socket that nobody has read yet (a request under way)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except OSError:  # nothing there (EAGAIN), or the connection is gone
        return False


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
        self.heap_reserve = settings.worker_heap_reserve_bytes
        self.in_flight = 0  # requests handed to a thread and not finished
        self.boot_resident = 0
        self.idle_checked = 0.0
        reserve_heap(self.heap_reserve)  # before any thread starts
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
        self.boot_resident = resident_bytes()

    # --- memory back when idle ------------------------------------------------------------------

    def _return_memory_if_idle(self) -> None:
        # A worker's heap keeps what a big request freed (service/heap.py). Once nothing runs and
        # the worker is IDLE_EXCESS_BYTES above its boot size, the free pages go back to the
        # kernel; checked at most once a second (one read of /proc), only when a request ends.
        now = time.monotonic()
        if self.in_flight or self.buffering or now - self.idle_checked < IDLE_CHECK_INTERVAL:
            return
        self.idle_checked = now
        if self.boot_resident and resident_bytes() > self.boot_resident + IDLE_EXCESS_BYTES:
            trim_heap(self.heap_reserve)

    # --- connections past worker_connections --------------------------------------------------

    def accept(self, listener):
        # gthread stops accepting at worker_connections, and a connection that never sends a byte
        # keeps its place until REQUEST_READ_TIMEOUT: enough of them and every new client waits in
        # the listen backlog. Here a place is made by closing the connection idle longest (kept
        # alive, or accepted and silent: nginx reuses its own so), and while every connection is
        # in the middle of a request a newcomer is answered 503 at once.
        if self.nr_conns + 1 >= self.worker_connections and not self._close_an_idle_connection():
            self._turn_away(listener)
            return
        super().accept(listener)

    def _close_an_idle_connection(self) -> bool:
        for conn in self.keepalived_conns:  # oldest first
            if not _bytes_waiting(conn.sock):
                self.keepalived_conns.remove(conn)
                try:
                    self.poller.unregister(conn.sock)
                except (KeyError, ValueError, OSError):
                    pass
                self.nr_conns -= 1
                conn.close()
                return True
        for pending in self.buffering.values():  # oldest first
            if not pending.framing.size and not _bytes_waiting(pending.conn.sock):
                self._park_end(pending)
                self._close(pending)
                return True
        return False

    def _turn_away(self, listener) -> None:
        try:
            sock, _ = listener.accept()
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        try:
            sock.setblocking(False)
            sock.send(problem_message("server-busy", "the server has too many connections open; retry shortly",
                                      {"Retry-After": str(self.retry_after)}))
            sock.recv(RECV_BYTES)  # what the client sent: closed unread, it would reset the answer
        except OSError:
            pass
        sock.close()

    # --- buffering in the event loop ----------------------------------------------------------

    def _bufferable(self, conn) -> bool:
        return not (self.cfg.is_ssl or conn.is_http2 or negotiation.prior_knowledge_allowed(self.cfg, conn.client))

    def finish_request(self, conn, fs):
        self.in_flight -= 1
        self._finish_request(conn, fs)
        self._return_memory_if_idle()

    def _finish_request(self, conn, fs):
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

    def _to_thread(self, conn) -> None:
        self.in_flight += 1
        super().enqueue_req(conn)

    def enqueue_req(self, conn):
        if not self._bufferable(conn):
            return self._to_thread(conn)
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
        self._to_thread(conn)

    def handle_request(self, req, conn):
        # The whole request is here: the client has had its 100 Continue from the event loop, if
        # it waited for one, and gunicorn's own would be a second (gunicorn 27's request field).
        if self._bufferable(conn):
            req._expected_100_continue = False
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
