"""The process a cascade's tool-call check runs in (router/request/tool_check.py decides when).

The worker's address space is capped (RLIMIT_AS) at what it had when it started plus the
headroom it is given, so a check that allocates without end fails with MemoryError in the
worker (given up as `out_of_memory`, the worker replaced) instead of growing the router pod
toward its memory limit, where the kernel would OOM-kill the router itself.

Workers are forked from multiprocessing's fork server, which has this module (and so
jsonschema) imported already: a new worker takes milliseconds, not an interpreter start. The
router's own process is never forked; it has threads (the ledger's checkpointer).
"""

from __future__ import annotations

import multiprocessing
import resource
import signal
import threading
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

from tiergate.router.request.tool_calls import tool_call_problem

__all__ = ["CheckWorker"]

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


def _serve(conn: Connection, headroom_bytes: int) -> None:
    """The worker: answer checks until the router closes its end (or kills it)."""
    # Ctrl-C in a terminal reaches the whole process group: the router decides when the
    # worker ends, and the user should not see a worker's KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _cap_address_space(headroom_bytes)
    while True:
        try:
            reply, request = conn.recv()
        except (EOFError, OSError):
            return
        except MemoryError:  # the check's payload alone is past the cap; the pipe is mid-message
            conn.send(("out_of_memory", None))
            return
        try:
            answer: tuple[str, str | None] = ("ok", tool_call_problem(reply, request))
        except MemoryError:
            answer = ("out_of_memory", None)  # the router replaces this worker
        except Exception as exc:  # a schema jsonschema cannot handle: not the model's fault
            answer = ("failed", type(exc).__name__)
        conn.send(answer)


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

    def ask(self, payload: tuple[Any, Any], timeout_s: float) -> tuple[str, str | None]:
        """Send one check and wait for its answer (runs in a thread)."""
        try:
            try:
                self.conn.send(payload)
            except OSError:  # the worker gave up mid-message (out of memory): its last word
                if self.conn.poll(0):
                    last: tuple[str, str | None] = self.conn.recv()
                    return last
                raise
            if not self.conn.poll(timeout_s):
                return ("timeout", None)
            answer: tuple[str, str | None] = self.conn.recv()
            return answer
        except (EOFError, OSError):
            return ("died", None)

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
