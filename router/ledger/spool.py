"""A local, durable spool for the records the PostgreSQL ledger cannot commit.

While the database is away, a router process appends each record it cannot commit to a file
of its own in the spool folder and fsyncs it before the reply's end goes out, so a reply a
client has whole survives the process. The process holds an exclusive `flock` on its file for
as long as it lives: a file nobody holds belongs to a process that died, and whichever process
of the pod finds it first replays it into the database (`PostgresLedger`) and deletes it. A
process clears its own file once everything it spooled is committed; when some of its records
are on disk only (a full backlog let go of them), it goes on in a new file and writes the old
one's records itself (`rotate`).

The files of one database share a folder (`spool_folder`). A file is JSON lines, one record
each, appended in the order they were made; a record that was amended is appended again, and
the one with the longest `latency_s` (a monotonic clock since the request began) is the
newest. A line cut short by a crash mid-write is skipped: its reply's end had not gone out.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tiergate.router.ledger.records import UsageRecord

__all__ = ["LedgerSpool", "Orphan", "latest", "spool_folder"]

log = logging.getLogger("tiergate.router")

#: The spool's file names: `<pid>-<random>.spool`.
SUFFIX = ".spool"
_FIELDS = {f.name for f in dataclasses.fields(UsageRecord)}
#: What each field of a line may hold (a line that holds anything else is unreadable: written
#: by hand, or by another version, its record could stall every replay after it).
_TEXT, _COUNT, _NUMBER, _FLAG = "text", "count", "number", "flag"
_REAL = (_NUMBER, _COUNT)  # a whole number is a number too
_KINDS = {
    "request_id": (_TEXT,), "time_s": _REAL, "tenant": (_TEXT,),
    "tier_requested": (_TEXT,), "tier_served": (_TEXT, None), "pool": (_TEXT, None),
    "endpoint": (_TEXT, None), "prompt_tokens": (_COUNT,), "completion_tokens": (_COUNT,),
    "latency_s": _REAL, "ttft_s": (*_REAL, None), "cost_usd": _REAL,
    "http_status": (_COUNT,), "outcome": (_TEXT,), "escalated": (_FLAG,), "attempt": (_COUNT,),
}  # fmt: skip
assert set(_KINDS) == _FIELDS, "every field of UsageRecord has its kind"


@dataclass
class Orphan:
    """A spool file whose records this process writes, locked by it until `done()` or
    `release()`: a dead process's, or its own former file (`LedgerSpool.rotate`)."""

    path: Path
    fd: int
    records: list[UsageRecord]
    unreadable: int  # lines that could not be read back (cut short by a crash)

    def read(self) -> None:
        """Read the file's records (a file `rotate` handed over is not read yet)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self.records, self.unreadable = _read(fd)
        finally:
            os.close(fd)

    def done(self) -> None:
        """The records are in the database: delete the file."""
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)

    def release(self) -> None:
        """Leave the file for a later try."""
        os.close(self.fd)


class LedgerSpool:
    """This process's spool file in `folder`, at most `max_bytes` long."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.path: Path | None = None
        self._fd: int | None = None
        self.bytes = 0  # in this process's file now
        self.spooled = 0  # records appended since start
        self.refused = 0  # records the spool could not take (full, or the disk failed)

    def open(self) -> None:
        """Create and lock this process's file (OSError when the folder cannot be used)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _fsync_folder(self.folder)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self.path, self._fd = path, fd
        self._report_strays()

    def _report_strays(self) -> None:
        """Log the spool files in the folders of other databases beside this one: written
        under another URL (the database's host spelt another way, or moved), no process of
        this one replays them. If it is the same database, moving them here replays them."""
        try:
            folders = [f for f in self.folder.parent.iterdir() if f.is_dir() and f != self.folder]
            for folder in sorted(folders):
                files = sum(1 for _ in folder.glob("*" + SUFFIX))
                if files:
                    log.warning(
                        "event=ledger_spool_elsewhere folder=%s files=%d replayed_from=%s",
                        folder, files, self.folder,
                    )  # fmt: skip
        except OSError:
            return

    def append(self, records: list[UsageRecord]) -> bool:
        """Append `records` and fsync them; False, with nothing appended, when they would take
        the file past `max_bytes` or the disk refused them."""
        assert self._fd is not None, "open() the spool first"
        data = "".join(_line(record) for record in records).encode()
        if self.bytes + len(data) > self.max_bytes:
            self.refused += len(records)
            return False
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write: {written} of {len(data)} bytes")
            os.fsync(self._fd)
        except OSError as exc:
            self.refused += len(records)
            log.error("event=ledger_spool_failed path=%s error=%s", self.path, exc)
            try:
                os.ftruncate(self._fd, self.bytes)  # nothing half-written stays
            except OSError:
                pass
            return False
        self.bytes += len(data)
        self.spooled += len(records)
        return True

    def rotate(self) -> Orphan:
        """Go on in a new file, and hand over this one, still locked and not yet read: it holds
        records only the disk has (a full backlog let go of them), which this process writes
        from it while new records go to the new file (OSError when no new file can be made)."""
        assert self._fd is not None and self.path is not None, "open() the spool first"
        path, fd = self.path, self._fd
        self.open()
        self.bytes = 0
        return Orphan(path, fd, [], 0)

    def clear(self) -> None:
        """Everything this process spooled is committed: empty its file."""
        if self._fd is None or not self.bytes:
            return
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        self.bytes = 0

    def close(self, *, keep: bool) -> None:
        """Close this process's file; delete it unless `keep` (records not yet committed)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        assert self.path is not None
        if not keep or not self.bytes:
            self.path.unlink(missing_ok=True)
        os.close(fd)

    def orphans(self) -> Iterator[Orphan]:
        """The files of processes that died, each locked for the caller, oldest first."""
        try:
            paths = sorted(self.folder.glob("*" + SUFFIX), key=_mtime)
        except OSError:
            return
        for path in paths:
            if path == self.path:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue  # replayed by another process meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # its process is alive, or another one is replaying it
            if os.fstat(fd).st_nlink == 0:
                os.close(fd)
                continue  # replayed and deleted before this lock was granted
            try:
                records, unreadable = _read(fd)
            except OSError as exc:
                os.close(fd)
                log.error("event=ledger_spool_unreadable path=%s error=%s", path, exc)
                continue
            yield Orphan(path, fd, records, unreadable)

    @property
    def used(self) -> bool:
        """Whether this process's file, open, holds records not yet committed."""
        return self._fd is not None and self.bytes > 0


def spool_folder(base: Path, database: str) -> Path:
    """The folder under `base` for the spools of the ledger `database` (its server and name,
    no credentials): processes of other databases never replay them."""
    return base / hashlib.sha256(database.encode()).hexdigest()[:16]


def latest(records: list[UsageRecord]) -> list[UsageRecord]:
    """The newest record of each attempt (the longest `latency_s`; the later one on a tie)."""
    newest: dict[tuple[str, int], UsageRecord] = {}
    for record in records:
        key = (record.request_id, record.attempt)
        seen = newest.get(key)
        if seen is None or record.latency_s >= seen.latency_s:
            newest[key] = record
    return list(newest.values())


def _line(record: UsageRecord) -> str:
    return json.dumps(dataclasses.asdict(record), separators=(",", ":")) + "\n"


def _read(fd: int) -> tuple[list[UsageRecord], int]:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    records: list[UsageRecord] = []
    unreadable = 0
    for line in b"".join(chunks).split(b"\n"):
        if not line:
            continue
        try:
            fields = json.loads(line)
            if not isinstance(fields, dict) or set(fields) != _FIELDS:
                raise ValueError("not a usage record")
            if not all(_kind(value) in _KINDS[name] for name, value in fields.items()):
                raise ValueError("a field of the wrong kind")
            records.append(UsageRecord(**fields))
        except ValueError:
            unreadable += 1
    return records, unreadable


def _kind(value: object) -> str | None:
    """`value`'s kind in `_KINDS` (None for null; "" for none of them)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return _FLAG
    if isinstance(value, int):
        return _COUNT if value >= 0 else _NUMBER
    if isinstance(value, float):
        return _NUMBER if math.isfinite(value) else ""
    return _TEXT if isinstance(value, str) else ""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _fsync_folder(folder: Path) -> None:
    """Make a new file's name durable (its folder's entry)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
