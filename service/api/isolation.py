"""A big request's instance is parsed, validated, compiled and encoded in a process beside its
worker, at a lower CPU priority, so that its CPU time shares neither the worker's GIL nor, when
the cores are busy, their time with the worker's other requests.

A worker serves one big request at a time (``BIG_REQUEST_BYTES``, service/api/limits.py). When
the one it holds carries an instance (``POST /v1/instances``, a session or a stateless select
with an inline ``instance``), :func:`parsed_in_isolation` hands the body's bytes to the worker's
:class:`IsolatedProcess` and its request thread waits, holding no GIL. The process runs what the
worker would have run on the body (service/api/bodies.py: parse, duplicate keys, depth,
validation, the request limits), then compiles the instance with the worker's limits and encodes
it in the store's format (service/store/codec.py). What comes back is plain data: the encoded
instance, which the worker decodes as it decodes one read from the store, or a refusal (the
error's class, message and fields), raised in the worker as the worker would have raised it. A
compilation's refusal is raised where compiling would have raised it (``Sessions.compile``), so
the order of a request's checks stays the same.

The project's gunicorn worker installs it (:func:`install`); an app served otherwise parses every
body itself. Each request gets a fresh process, forked from a server that imported this module once (the
``forkserver`` start method), niced by ``ISOLATED_NICE``: what it allocated goes back to the
system when it exits, so a worker's idle size does not grow with the big requests it served.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import orjson
from flask import current_app
from pydantic import BaseModel

from schemas.api import SelectRequest, SessionCreate
from schemas.instance import Instance
from service import engine
from service.errors import ServiceError
from service.heap import reserve_heap
from service.sessions.precompiled import PrecompiledInstance
from service.store.encoded import EncodedInstance

from .context import EXTENSION as SERVICES, services
from .limits import holding_big_request, refuse_parse_cost

Model = TypeVar("Model", bound=BaseModel)
# CFS weights: a nice-5 process gets ~1/4 of a core against a busy nice-0 one, so a big
# request still finishes while ordinary requests keep their share. Raising a priority needs
# privileges, lowering it does not: the process is niced once, when it starts.
ISOLATED_NICE = 5
EXTENSION = "edgecut.isolated-process"
# The bodies that carry an instance, by the name the isolated process knows them by.
MODELS: dict[str, type[BaseModel]] = {model.__name__: model for model in (Instance, SessionCreate, SelectRequest)}
# Stands for the inline instance while the rest of a session request is validated again.
_SOME_INSTANCE_ID = "0" * 64
_JOB_DIRECTORY_PREFIX = "edgecut-isolated-"


class IsolatedProcess:
    """The worker's process for big requests: one at a time, a fresh one for each. Each keeps
    ``heap_reserve`` bytes of heap faulted in, as a worker does (service/heap.py), written as it
    starts: the pool starts the next process as soon as the last has served, so the reserve is
    paid for before the next big request arrives, not while it waits."""

    def __init__(self, heap_reserve: int = 0) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._heap_reserve = heap_reserve

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(["service.api.bodies"])  # imports this module too
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_start_in_isolation,
                                                 initargs=(ISOLATED_NICE, os.getpid(), self._heap_reserve),
                                                 max_tasks_per_child=1)
            return self._pool

    def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in the process; its result, pickled there and unpickled here."""
        pool = self._executor()
        try:
            return pool.submit(function, *args).result()
        except BrokenProcessPool:  # the process died (killed, out of memory): a new one next time
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False)
            raise

    def warm(self) -> None:
        """Start the fork server and a first process before the first big request needs them."""
        self.run(os.getpid)

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def install(app: Any) -> IsolatedProcess | None:
    """Give ``app`` an isolated process (the project's gunicorn worker does, service/worker/);
    an edgecut app without one (a test client's) parses every body itself. None for an app that
    is not edgecut's (the benches' floor runs under the same worker)."""
    services = getattr(app, "extensions", {}).get(SERVICES)
    if services is None:
        return None
    return app.extensions.setdefault(EXTENSION, IsolatedProcess(services.settings.worker_heap_reserve_bytes))


def carries_an_instance(model: type[BaseModel], raw: bytes) -> bool:
    """Whether a body of ``model`` may carry an inline instance (a session request's ``instance``
    key, looked for in its bytes: found in a string too, it is only parsed here again)."""
    if MODELS.get(model.__name__) is not model:
        return False
    return model is Instance or b'"instance"' in raw


def parsed_in_isolation(model: type[Model], raw: bytes, boundary: str | None = None,
                        array_parts: tuple[str, ...] = ()) -> Model | None:
    """``raw`` parsed as ``model`` by the worker's isolated process, its instance compiled there:
    None when the request holds no big-request slot or carries no instance (parse it here)."""
    isolated = current_app.extensions.get(EXTENSION)
    if isolated is None or not holding_big_request() or not carries_an_instance(model, raw):
        return None
    app_services = services()
    with job_directory() as directory:
        files = Path(directory)
        # Bytes go through files, each written and read by one system call made without the GIL:
        # pickled, an 80 MB body would be copied holding it (~60 ms) on each side.
        (files / "body").write_bytes(raw)
        job = (model.__name__, str(files / "body"), boundary, array_parts, app_services.settings,
               app_services.sessions.compile_limits, str(files / "header"), str(files / "encoded"))
        outcome = isolated.run(parse_and_compile, job)
        if outcome[0] == "inline":
            return None
        if outcome[0] == "refused":
            raise refusal(*outcome[1:])
        _, compiled, rest = outcome
        stand_in = PrecompiledInstance.of(
            refusal(*compiled[1:]) if compiled[0] == "refused"
            else EncodedInstance((files / "header").read_bytes(), (files / "encoded").read_bytes(), **compiled[1]))
    if model is Instance:
        return stand_in  # type: ignore[return-value]
    # The rest of the body, validated here as it was there (its limits too), with the instance
    # put back in its place.
    parsed = model.model_validate({**orjson.loads(rest), "instance_id": _SOME_INSTANCE_ID})
    return parsed.model_copy(update={"instance_id": None, "instance": stand_in})


def job_directory() -> tempfile.TemporaryDirectory:
    """A private directory for one job's files, named after the worker, so that the isolated
    process can remove it when the worker is killed before it could (:func:`_exit_with`)."""
    return tempfile.TemporaryDirectory(prefix=f"{_JOB_DIRECTORY_PREFIX}{os.getpid()}-")


# --- in the isolated process ---------------------------------------------------------------------


def _start_in_isolation(nice: int, worker_pid: int, heap_reserve: int) -> None:
    os.nice(nice)
    reserve_heap(heap_reserve)  # niced first: the writes run at the lower priority
    threading.Thread(target=_exit_with, args=(worker_pid,), name="edgecut-exit-with-worker", daemon=True).start()


def _exit_with(worker_pid: int) -> None:
    """Exit once the worker has, removing the worker's job directories: killed (its timeout, out of
    memory), it never says so, and this process would wait for its next job forever, keeping the
    fork server alive with it."""
    try:
        watched = os.pidfd_open(worker_pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): ask every second
        while _alive(worker_pid):
            time.sleep(1.0)
    else:
        select.select([watched], [], [])  # readable once the process has exited
    # A worker killed in the middle of a job never left its `with`: its files would stay.
    for directory in Path(tempfile.gettempdir()).glob(f"{_JOB_DIRECTORY_PREFIX}{worker_pid}-*"):
        shutil.rmtree(directory, ignore_errors=True)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_and_compile(job: tuple) -> tuple:
    """The body of a big request parsed as the worker would, its instance compiled and encoded:
    ``("compiled", ("encoded", its facts) or a compilation's refusal, the rest of the body as
    JSON)``, its header and body written to the files the job names, or ``("refused", …)``, or ``("inline",)`` when it carries no instance after all.
    Plain data only, whatever the body held."""
    from .bodies import from_parts, loaded, validated  # this module is imported by bodies

    name, body_path, boundary, array_parts, settings, compile_limits, header_path, encoded_path = job
    model = MODELS[name]
    raw = Path(body_path).read_bytes()
    try:
        if boundary is None:
            refuse_parse_cost(raw, settings)  # the worker checks only a body small in bytes
            data, arrays = loaded(raw, settings), None
        else:
            data, arrays = from_parts(raw, boundary, array_parts, settings, refuse_parse_cost)
        parsed = validated(data, model, settings, arrays)
    except (ServiceError, engine.EngineError) as error:
        return ("refused", *_plain(error))
    instance = parsed if isinstance(parsed, Instance) else getattr(parsed, "instance", None)
    if instance is None:
        return ("inline",)
    try:
        encoded = EncodedInstance.of(engine.compile_instance(instance, **compile_limits))
    except (ServiceError, engine.EngineError) as error:
        compiled: tuple = ("refused", *_plain(error))
    else:
        Path(header_path).write_bytes(encoded.header)
        Path(encoded_path).write_bytes(encoded.body)
        compiled = ("encoded", encoded.facts())
    rest = b"" if instance is parsed else orjson.dumps({key: value for key, value in data.items() if key != "instance"})
    return ("compiled", compiled, rest)


def _plain(error: Exception) -> tuple[str, str, str, dict]:
    """An error as data: its class's module and name, its message, its fields (plain values)."""
    return type(error).__module__, type(error).__qualname__, str(error), dict(vars(error))


def _refusal_classes(base: type) -> dict[tuple[str, str], type]:
    found, todo = {}, [base]
    while todo:
        cls = todo.pop()
        found[(cls.__module__, cls.__qualname__)] = cls
        todo.extend(cls.__subclasses__())
    return found


def refusal(module: str, name: str, message: str, fields: dict) -> Exception:
    """The error :func:`_plain` described, made again: only a service or an engine error."""
    known = {**_refusal_classes(ServiceError), **_refusal_classes(engine.EngineError)}
    cls = known.get((module, name))
    if cls is None:
        return RuntimeError(f"the isolated process refused with an unknown error {module}.{name}: {message}")
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(fields)
    return error
