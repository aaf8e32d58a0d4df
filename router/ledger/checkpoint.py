"""Folding the SQLite ledger's WAL back into its database file, on a thread of its own."""

from __future__ import annotations

import os
import sqlite3
import threading

__all__ = ["Checkpointer"]


class Checkpointer:
    """A daemon thread that checkpoints the WAL of the database at `path` periodically.

    Each round: a PASSIVE pass, which copies what it can without waiting for, or blocking, the
    writer; then, when the WAL holds `restart_frames` or more, a RESTART pass, which holds the
    writer back while it copies the rest, so that the next commit starts the WAL over. When the
    writer cannot be held back within the connection's timeout, SQLite degrades that pass to a
    passive one and the next round tries again; a failure is retried next round too (the WAL
    only grows meanwhile; nothing recorded is at risk).

    A WAL file is reused, never shrunk, below `journal_size_limit`. So when the file is longer
    than `keep_bytes` and than twice the frames it holds now (it grew while checkpoints could
    not finish, and the load that needs it is gone), a TRUNCATE pass cuts it to nothing; the
    writer grows it again as far as the load needs.
    """

    def __init__(self, path: str, interval_s: float, restart_frames: int, keep_bytes: int) -> None:
        self._path = path
        self._interval_s = interval_s
        self._restart_frames = restart_frames
        self._keep_bytes = keep_bytes
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            # The timeout bounds the wait for the writer's current transaction (microseconds).
            db = sqlite3.connect(self._path, isolation_level=None, timeout=0.5)
            # The checkpoint's own fsyncs (WAL before copying, database after) follow this.
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error:
            return  # the main connection reports problems with the file
        try:
            while not self._stopping.wait(self._interval_s):
                try:
                    self.checkpoint(db)
                except sqlite3.Error:
                    continue
        finally:
            db.close()

    def checkpoint(self, db: sqlite3.Connection) -> None:
        """One round (see the class docstring)."""
        _, frames, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if frames >= self._restart_frames:
            db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        try:
            wal_bytes = os.stat(self._path + "-wal").st_size
        except OSError:
            return
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
        held_bytes = max(frames, 0) * (_WAL_FRAME_HEADER + page_size)
        if wal_bytes > max(self._keep_bytes, 2 * held_bytes):
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()


#: Bytes before each page in a WAL file (SQLite's file format).
_WAL_FRAME_HEADER = 24
