"""The process a cascade's tool-call check runs in (router/request/tool_check.py decides when).

The worker's address space is capped (RLIMIT_AS) at what it had when it started plus the
headroom it is given, so a check that allocates without end fails with MemoryError in the
worker (given up as `out_of_memory`, the worker replaced) instead of growing the router pod
toward its memory limit, where the kernel would OOM-kill the router itself.

A check's deadline is CPU time, kept by the kernel: the worker arms a profiling timer
(ITIMER_PROF) for each check, and SIGPROF's default action ends the worker when the check has
run for that long, however long the machine's load made it wait for a CPU; a `re` match in C
cannot be interrupted any other way. The router only gives up on a worker that has neither
answered nor reached its deadline in a wall-clock backstop (`stalled`: stopped, or starved).

Workers are forked from multiprocessing's fork server, which has this module (and so
jsonschema) imported already: a new worker takes milliseconds, not an interpreter start. The
router's own process is never forked; it has threads (the ledger's checkpointer).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

from tiergate.router.request.tool_calls import tool_call_problem

__all__ = ["Answer", "CheckWorker"]

_context_lock = threading.Lock()
_context: ForkServerContext | None = None


def _fork_server() -> ForkServerContext:
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            assert isinstance(context, ForkServerContext)
            context.set_forkserver_preload([__name__])
            _context = context
        return _context


@dataclass(frozen=True, slots=True)
class Answer:
    """What became of one check on a worker."""

    #: ok (value: the problem, or None), failed (value: the exception the schema raised),
    #: timeout (its CPU deadline), out_of_memory, stalled (the backstop), died.
    status: str
    value: str | None = None
    #: CPU time the check used in the worker; None when not known (the worker died, or was
    #: given up on where /proc is absent).
    cpu_s: float | None = None


def _serve(conn: Connection, headroom_bytes: int) -> None:
    """The worker: answer checks until the router closes its end (or kills it)."""
    # Ctrl-C in a terminal reaches the whole process group: the router decides when the
    # worker ends, and the user should not see a worker's KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # ends the worker at a check's CPU deadline
    _cap_address_space(headroom_bytes)
    while True:
        try:
            (reply, request), cpu_limit_s = conn.recv()
        except (EOFError, OSError):
            return
        except MemoryError:  # the check's payload alone is past the cap; the pipe is mid-message
            conn.send(("out_of_memory", None, 0.0))
            return
        started_s = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, cpu_limit_s)
        try:
            answer: tuple[str, str | None] = ("ok", tool_call_problem(reply, request))
        except MemoryError:
            answer = ("out_of_memory", None)  # the router replaces this worker
        except Exception as exc:  # a schema jsonschema cannot handle: not the model's fault
            answer = ("failed", type(exc).__name__)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        conn.send((*answer, time.process_time() - started_s))


def _cap_address_space(headroom_bytes: int) -> None:
    """RLIMIT_AS at the worker's address space now plus `headroom_bytes` (Linux; elsewhere,
    where /proc is absent, the worker runs uncapped)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[0])
    except (OSError, ValueError, IndexError):
        return
    limit = pages * resource.getpagesize() + headroom_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


class CheckWorker:
    """One worker process and the router's end of its pipe."""

    def __init__(self, headroom_bytes: int) -> None:
        context = _fork_server()
        self.conn, child = context.Pipe()
        self.process: BaseProcess = context.Process(
            target=_serve, args=(child, headroom_bytes), name="tiergate-tool-check", daemon=True
        )
        self.process.start()
        child.close()
        self._killed = False
        self._cpu_at_ask_s: float | None = None  # the worker's CPU time as the check was sent

    def ask(self, payload: tuple[Any, Any], cpu_limit_s: float, stall_s: float) -> Answer:
        """Send one check and wait for its answer (runs in a thread): the check may use
        `cpu_limit_s` of CPU time; past `stall_s` of wall-clock time without an answer, it is
        given up as stalled."""
        self._cpu_at_ask_s = self._cpu_s()
        try:
            try:
                self.conn.send((payload, cpu_limit_s))
            except OSError:  # the worker gave up mid-message (out of memory): its last word
                if self.conn.poll(0):
                    return Answer(*self.conn.recv())
                raise
            if not self.conn.poll(stall_s):
                return Answer("stalled", cpu_s=self.check_cpu_s())
            return Answer(*self.conn.recv())
        except (EOFError, OSError):
            if not self._killed:  # ended from outside the router: by its deadline?
                self.process.join(5)
                if self.process.exitcode == -signal.SIGPROF:
                    return Answer("timeout", cpu_s=cpu_limit_s)
            return Answer("died")

    def check_cpu_s(self) -> float | None:
        """CPU time the worker has used since the current check was sent (Linux; None where
        /proc is absent, or once the worker is gone)."""
        now = self._cpu_s()
        if now is None or self._cpu_at_ask_s is None:
            return None
        return max(0.0, now - self._cpu_at_ask_s)

    def _cpu_s(self) -> float | None:
        """The worker's CPU time (user and system) from /proc/<pid>/stat."""
        try:
            with open(f"/proc/{self.process.pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """End the worker process (once; later calls do nothing). A thread in `ask` sees it
        end and returns; the pipe stays open for it until `close`."""
        if self._killed:
            return
        self._killed = True
        self.process.kill()
        self.process.join(5)

    def close(self) -> None:
        """Kill the worker and close the router's end of its pipe, once no thread is in `ask`:
        a thread still in it would read or write whatever the descriptor's number names next,
        such as the pipe of a worker started meanwhile."""
        self.kill()
        self.conn.close()
