"""Where one HTTP/1.1 request ends in the bytes received so far: llhttp (through httptools) reads
it for the worker's event loop (service/worker/__init__.py, the worker class)."""

from __future__ import annotations

import httptools


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
    def content_length(self) -> int | None:
        """The body's announced length, once the head is read (None: chunked, or none given)."""
        return self._reader.content_length

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
