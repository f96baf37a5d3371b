"""Outlines compiles in child processes: a hard time limit, a memory cap, and the lowest CPU priority.

An outlines-core `Index` build cannot be cancelled, takes seconds to minutes and sometimes gigabytes; in a thread
it would outlive its time limit and compete with decoding for the cores. So each build runs in a worker process
started as `python -m constrain.compile_worker` (no fork of a process that holds torch threads). A worker imports
only numpy and outlines-core, lowers its own priority (nice 19), caps its address space (RLIMIT_AS), receives the
vocabulary once, then builds TokenDFAs one at a time, writing each with `TokenDFA.save` to the path it is given.
The parent kills a worker whose build passes its deadline and every worker when the pool closes; a worker also
exits as soon as its parent is gone. This module must never import torch (the child imports it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Callable

_HEADER = 8  # big-endian message length, then a pickle
log = logging.getLogger(__name__)


class BuildTimeout(Exception):
    """The build passed its deadline; its worker was killed."""


class BuildFailed(Exception):
    """The build did not produce an automaton. `kind`: refused (outlines-core rejected the regex), unwritable
    (the automaton could not be written where asked: a full disk), memory (the worker hit its memory cap), died
    (the worker exited otherwise), unstarted (no worker was ready by the deadline: the machine's fault, not the
    regex's) or closed (the pool was closed)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


# ---- the child --------------------------------------------------------------------------------------------------
def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(len(data).to_bytes(_HEADER, "big") + data)
    f.flush()


def _recv(f):
    head = f.read(_HEADER)
    if len(head) < _HEADER:
        return None
    return pickle.loads(f.read(int.from_bytes(head, "big")))


def _exit_with_parent(parent: int) -> None:
    """A build holds no GIL, so this thread runs during one: the worker never outlives the server."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main(argv: list[str]) -> int:
    nice, memory_bytes = int(argv[0]), int(argv[1])
    t0 = time.perf_counter()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    os.nice(nice)
    if memory_bytes > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol
    from constrain.token_dfa import TokenDFA, outlines_vocabulary_from_bytes

    msg = _recv(inp)
    if msg is None:
        return 0
    _, token_bytes, eos_ids = msg
    ov = outlines_vocabulary_from_bytes(token_bytes, eos_ids)
    del token_bytes
    _send(out, ("ready", time.perf_counter() - t0))
    while True:
        job = _recv(inp)
        if job is None:
            return 0
        _, regex, path, label = job
        t = time.perf_counter()
        try:
            dfa = TokenDFA.build(regex, ov, eos_ids)
            tmp = f"{path}.tmp{os.getpid()}"
            try:
                dfa.save(tmp, label)
                os.replace(tmp, path)
            except OSError as exc:  # (a full disk, a folder gone: the place's fault, not the regex's)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                _send(out, ("unwritable", f"{type(exc).__name__}: {str(exc)[:300]}"))
                continue
            finally:
                del dfa
            _send(out, ("ok", time.perf_counter() - t))
        except MemoryError:
            _send(out, ("memory", f"needed more than the {memory_bytes >> 20} MiB a compile may use"))
            return 1
        except (ValueError, RuntimeError) as exc:  # outlines-core's refusals (PanicException is a BaseException)
            _send(out, ("refused", str(exc)[:300]))
        except BaseException as exc:  # noqa: BLE001 - report it and exit: the parent starts a fresh worker
            _send(out, ("died", f"{type(exc).__name__}: {str(exc)[:300]}"))
            return 1


# ---- the parent -------------------------------------------------------------------------------------------------
def _ready(fd: int, event: int, seconds: float) -> bool:
    """Whether `fd` is ready for `event` (or closed at the other end) within `seconds`. poll, not select: select
    refuses descriptors past 1023, and a server holding a thousand connections failed every build (QA review13)."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(1, math.ceil(seconds * 1000))))


class _Worker:
    def __init__(self, args: list[str], env: dict):
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.pid = self.proc.pid
        self._fd = self.proc.stdout.fileno()
        self._in = self.proc.stdin.fileno()
        os.set_blocking(self._in, False)

    def send(self, obj, deadline: float) -> None:
        """BuildTimeout at the deadline. A worker reads its vocabulary (megabytes, past a pipe's buffer) only once
        its imports are done: on a loaded machine a blocking write held the build seconds past its time limit, and
        a worker that never read would have held it for good."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        left_to_write = memoryview(len(data).to_bytes(_HEADER, "big") + data)
        while left_to_write:
            left = deadline - time.monotonic()
            if left <= 0 or not _ready(self._in, select.POLLOUT, left):
                raise BuildTimeout()
            try:
                left_to_write = left_to_write[os.write(self._in, left_to_write):]
            except BlockingIOError:  # (writable, yet the pipe took nothing: select again)
                continue

    def recv(self, deadline: float):
        """The next message, BuildTimeout at the deadline, None when the worker exited."""
        head = self._read(_HEADER, deadline)
        if head is None:
            return None
        body = self._read(int.from_bytes(head, "big"), deadline)
        return None if body is None else pickle.loads(body)

    def _read(self, n: int, deadline: float) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not _ready(self._fd, select.POLLIN, left):
                raise BuildTimeout()
            chunk = os.read(self._fd, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def signal_kill(self) -> None:
        """SIGKILL, nothing more: whoever uses the worker sees it gone, and reaps it (`kill`)."""
        if self.proc.poll() is None:
            self.proc.kill()

    def kill(self) -> int:
        """Kill and reap: once this returns the process no longer exists."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        return code


_POOLS: "weakref.WeakSet[CompileWorkers]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()


class CompileWorkers:
    """At most `max_workers` build processes, started on first use and reused; thread-safe.

    `memory_mb` caps each worker's address space (0 = no cap); a worker that passes a build's deadline is killed
    (and reaped) before `build` raises BuildTimeout."""

    def __init__(self, token_bytes: list[bytes | None], eos_ids, *, max_workers: int = 2, memory_mb: int = 4096,
                 nice: int = 19):
        self._vocab_msg = ("vocab", list(token_bytes), sorted(int(i) for i in eos_ids))
        self.memory_mb = memory_mb
        self.nice = nice
        self._slots = threading.BoundedSemaphore(max_workers)
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.started: deque[int] = deque(maxlen=64)  # recent worker pids (logs and tests)
        self.startup_seconds: deque[float] = deque(maxlen=64)  # spawn to ready, as the parent saw it
        self.killed = 0
        _POOLS.add(self)

    def build(self, regex: str, out_path: Path, timeout_s: float, label: str = "",
              on_begin: Callable[[], None] | None = None) -> float:
        """Write the regex's TokenDFA to `out_path` (npz, saved with `label`); returns the build seconds. The time
        limit is the build's, from when a worker is ready (`on_begin` is called then); starting a worker where none
        is idle has a limit as long (BuildFailed "unstarted"). Counted from the request, a start that took most of
        it left the build a sliver, and the constraint was remembered as too slow (QA review14 F2). Raises
        BuildTimeout or BuildFailed."""
        if not self._slots.acquire(timeout=max(timeout_s, 0)):
            raise BuildTimeout()
        try:
            w = self._take(time.monotonic() + timeout_s)
            deadline = time.monotonic() + timeout_s
            if on_begin is not None:
                on_begin()
            try:
                w.send(("build", regex, str(out_path), label), deadline)
                reply = w.recv(deadline)
            except BuildTimeout:
                self._discard(w)
                self.killed += 1
                raise
            except OSError:  # the worker went away under us (closed, or killed from outside)
                reply = None
            except BaseException:
                self._discard(w)
                raise
            if reply is None or reply[0] in ("memory", "died"):
                code = self._discard(w)
                if self._closed:
                    raise BuildFailed("closed", "the compiler was closed")
                if reply is not None:
                    raise BuildFailed(reply[0], reply[1])
                if code in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGBUS):  # allocation failure under the cap
                    raise BuildFailed("memory", f"needed more than the {self.memory_mb} MiB a compile may use")
                raise BuildFailed("died", f"the compile process exited with code {code}")
            self._put_back(w)
            if reply[0] in ("refused", "unwritable"):
                raise BuildFailed(reply[0], reply[1])
            return float(reply[1])
        finally:
            self._slots.release()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._live]

    def close(self) -> None:
        """Kill every worker, busy or idle; later builds fail with BuildFailed('closed'). A busy worker's pipes are
        left to the thread using them (which sees the worker gone, and discards it): closed here, their descriptor
        numbers could be reused under that thread, which would write a vocabulary into some other file."""
        with self._lock:
            self._closed = True
            idle, busy = list(self._idle), [w for w in self._live if w not in self._idle]
            self._idle.clear()
            self._live.difference_update(idle)
        for w in idle:
            w.kill()
        for w in busy:
            w.signal_kill()
            w.proc.wait()  # (reaped here or by its thread, whichever comes first: gone once this returns)

    # ---- internals ------------------------------------------------------------------------------------------
    def _take(self, deadline: float) -> _Worker:
        """An idle worker, else a new one. An idle worker that exited (killed from outside) is discarded: sending
        it the next build failed that build, an unrelated constraint remembered as failed (QA review13 F2)."""
        while True:
            with self._lock:
                if self._closed:
                    raise BuildFailed("closed", "the compiler was closed")
                w = self._idle.pop() if self._idle else None
            if w is None:
                return self._spawn(deadline)
            if w.proc.poll() is None:
                return w
            log.warning("compile worker %d exited while idle (code %s): starting another", w.pid, w.proc.returncode)
            self._discard(w)

    def _spawn(self, deadline: float) -> _Worker:
        t0 = time.monotonic()
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                               os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        memory = self.memory_mb << 20 if self.memory_mb > 0 else 0
        args = [sys.executable, "-m", "constrain.compile_worker", str(self.nice), str(memory)]
        with self._lock:
            if self._closed:
                raise BuildFailed("closed", "the compiler was closed")
            w = _Worker(args, env)
            self._live.add(w)
            self.started.append(w.pid)
        try:
            w.send(self._vocab_msg, deadline)
            reply = w.recv(deadline)
        except BuildTimeout:
            self._discard(w)
            self.killed += 1
            raise BuildFailed("unstarted", f"no compile process was ready within the time limit (this one took "
                                           f"longer than {time.monotonic() - t0:.0f} s to start: the machine may be "
                                           f"overloaded)") from None
        except OSError:
            reply = None
        except BaseException:
            self._discard(w)
            raise
        if reply is None or reply[0] != "ready":
            code = self._discard(w)
            if self._closed:
                raise BuildFailed("closed", "the compiler was closed")
            raise BuildFailed("died", f"the compile process failed to start (exit {code})")
        self.startup_seconds.append(time.monotonic() - t0)
        return w

    def _put_back(self, w: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(w)
                return
        self._discard(w)

    def _discard(self, w: _Worker) -> int:
        code = w.kill()
        with self._lock:
            self._live.discard(w)
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
