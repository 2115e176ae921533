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
the worker. Idle more than ``IDLE_EXCESS_BYTES`` above its size at boot, it gives its heap's
free pages back (``trim_heap``).

docker-compose.yml puts nginx in front (deploy/nginx.conf.template), which buffers requests
too; this worker stays behind it because ``edgecut serve`` has no nginx, and because gunicorn's
own refusals of what nginx passes on would otherwise be HTML (docs/reliability.md).

Everything gunicorn itself refuses (a 414 request line, a control character in a header, …) is
answered in RFC 9457 problem+json like the application's own errors, never gunicorn's HTML page.
TLS and HTTP/2 connections are served as by gthread.
"""

from __future__ import annotations

import errno
import io
import selectors
import signal
import socket
import threading
import time
from functools import partial

from gunicorn.http.body import LengthReader
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import ThreadWorker

from service.api import isolation
from service.api.limits import big_request_in_flight
from service.app import rehearse, warm_up
from service.heap import reserve_heap, resident_bytes, trim_heap
from service.settings import load_settings
from service.worker.framing import Framing
from service.worker.held import RECV_BYTES, HeldUnreader
from service.worker.refusals import refusal_for, problem_message

WARM_UP_WAIT = 0.5  # seconds a new worker waits for its store's connections before serving
# An idle worker this far above its size at boot gives its heap's free pages back.
IDLE_EXCESS_BYTES = 64 * 1024 * 1024
IDLE_CHECK_INTERVAL = 1.0  # seconds
# gunicorn's header limits may be 0 ("unlimited"); the buffer still needs a bound.
UNLIMITED_HEADER_BYTES = 1024 * 1024


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
        # Until gunicorn installs this worker's signal handlers (in super().init_process()), the
        # arbiter's, inherited through fork, would take a stop and drop it: the worker would boot
        # and serve, and the arbiter wait out its graceful timeout before killing it.
        self.stop_while_booting = False
        self.isolated: isolation.IsolatedProcess | None = None
        for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            signal.signal(stop, self._note_stop_while_booting)
        settings = load_settings()
        self.read_timeout = settings.request_read_timeout
        self.buffer_budget = settings.request_buffer_bytes
        self.max_body_bytes = settings.max_body_bytes
        self.retry_after = settings.retry_after_seconds
        self.big_request_bytes = settings.big_request_bytes
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

    def run(self):
        try:
            super().run()
        finally:
            # While the worker still runs: left to the interpreter's exit, a process the pool starts
            # meanwhile (the next one, once the warm-up's has served) would find the pool's
            # semaphores already gone and print a traceback.
            if self.isolated is not None:
                self.isolated.shutdown()

    def _note_stop_while_booting(self, signum, frame) -> None:
        self.stop_while_booting = True

    def load_wsgi(self):
        # The worker's own handlers are in place (gunicorn installs them just before): a stop that
        # came earlier ends the worker as soon as it boots.
        if self.stop_while_booting:
            self.alive = False
        super().load_wsgi()
        # An edgecut app's big requests' instances are compiled beside it (none for another app).
        self.isolated = isolation.install(self.wsgi)
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
            if self._big_and_busy(framing):
                # Refused as the application would refuse it once read (service/api/limits.py),
                # before its body is received: a refused 80 MB body would cost the event loop
                # what it costs to receive it.
                self._park_end(pending)
                self._refuse(pending, "server-busy", f"this worker is serving another request of at least "
                             f"{self.big_request_bytes} bytes (BIG_REQUEST_BYTES); retry after Retry-After seconds",
                             {"Retry-After": str(self.retry_after)})
                return True
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

    def _big_and_busy(self, framing: Framing) -> bool:
        length = framing.content_length
        return (framing.has_body_pending and length is not None and length >= self.big_request_bytes
                and big_request_in_flight(self.wsgi))

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
        code, detail = refusal_for(exc)
        if code == "internal-error":
            self.log.exception("error handling a request")
        else:
            self.log.info("refused a request from %s: %s", (addr or ("?",))[0], exc)
        try:
            client.setblocking(False)
            client.send(problem_message(code, detail[:300]))
        except OSError:
            pass
