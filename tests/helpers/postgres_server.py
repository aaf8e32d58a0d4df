"""A real PostgreSQL server for tests: Debian's `postgresql` package (installed with apt-get
when it is missing), on its own data directory and a free loopback port, stopped afterwards.

A missing server is a failure with a clear message, never a skip. Run as root (this machine's
CI), the server runs as the `postgres` user the package creates: PostgreSQL refuses root.
Connections use a password (scram-sha-256), so a wrong one is refused as in production.
A server may get a data directory of its own small size (a tmpfs, mounted as root), which a
test fills to see what a full disk does.
(A uniquely named module: conftest names clash.)
"""

from __future__ import annotations

import errno
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from loopback_ports import free_port
from polling_helpers import until

PASSWORD = "tiergate-test"
USER = "postgres"
#: The longest the server may take to start or stop on a busy machine.
START_WITHIN_S = 60.0


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries, and apt-get could not install them."""


def server_bin() -> Path:
    """The newest /usr/lib/postgresql/*/bin with a server, installing the package if none."""
    found = _newest_bin()
    if found is None:
        if shutil.which("apt-get") is None:
            raise PostgresMissing(
                "no PostgreSQL server under /usr/lib/postgresql/*/bin and no apt-get to install "
                "it: install Debian's postgresql package"
            )
        result = subprocess.run(
            ["apt-get", "install", "-y", "-q", "postgresql"],
            capture_output=True,
            text=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            check=False,
        )
        found = _newest_bin()
        if found is None:
            raise PostgresMissing(
                "no PostgreSQL server under /usr/lib/postgresql/*/bin, and `apt-get install "
                f"postgresql` failed ({result.returncode}): {result.stderr.strip()[-500:]}"
            )
    return found


def _newest_bin() -> Path | None:
    bins = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "postgres").exists()]
    bins.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return bins[-1] if bins else None


@dataclass
class PostgresServer:
    """One server: `start()`, `stop()` (and start again: same data, same port), `close()`."""

    root: Path
    bin: Path = field(default_factory=server_bin)
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    #: The data directory's size in MiB (a tmpfs of its own), or None for the root's disk.
    data_mb: int | None = None

    def __post_init__(self) -> None:
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.root.mkdir(parents=True, exist_ok=True)
        self._as_user = os.geteuid() == 0
        if self._as_user:
            account = pwd.getpwnam(USER)
            self._ids = (account.pw_uid, account.pw_gid)
            os.chown(self.root, *self._ids)
        if self.data_mb is not None:
            self._mount_data(self.data_mb)
        try:
            self._init_data()
        except BaseException:
            self.close()
            raise

    def _init_data(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_user:
            os.chown(pwfile, *self._ids)
        self._run(
            "initdb", "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}",
            "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8",
            "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '{self.host}'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                # A test server: durability is the ledger's to prove, not the disk's.
                "fsync = off\nsynchronous_commit = on\nfull_page_writes = off\n"
                "max_connections = 200\nshared_buffers = 32MB\n"
            )
        with (self.data / "pg_hba.conf").open("a") as hba:
            # Pods of the e2e suite's local cluster connect from their own 127.x addresses.
            hba.write("host all all 127.0.0.0/8 scram-sha-256\n")

    def _mount_data(self, size_mb: int) -> None:
        if not self._as_user:
            raise RuntimeError(
                "a PostgreSQL data directory of its own size is a tmpfs, and mounting one "
                "needs root: run the tests as root"
            )
        self.data.mkdir(mode=0o700)
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tiergate-pg",
             str(self.data)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if mounted.returncode != 0:
            raise RuntimeError(f"cannot mount a tmpfs for PostgreSQL: {mounted.stderr.strip()}")
        os.chown(self.data, *self._ids)

    @property
    def _filler(self) -> Path:
        return self.data / "tiergate-filler"

    def fill_disk(self) -> None:
        """Take every free byte of the data directory's disk (a `data_mb` server only)."""
        if self.data_mb is None:
            raise RuntimeError("only a server with a data_mb of its own can fill its disk")
        chunk = b"\0" * (1 << 16)
        with self._filler.open("ab") as filler:
            try:
                while True:
                    filler.write(chunk)
                    filler.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise

    def free_disk(self) -> None:
        """Give back what `fill_disk` took."""
        self._filler.unlink(missing_ok=True)

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / tool), *args]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=False,
            user=self._ids[0] if self._as_user else None,
            group=self._ids[1] if self._as_user else None,
            cwd=self.root,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({result.returncode}): {result.stderr.strip()[-800:]}"
                f"\n{self.log_tail()}"
            )
        return result

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def start(self) -> None:
        # -w waits until it accepts connections; pg_ctl's own timeout, not a sleep.
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
            "-t", str(int(START_WITHIN_S)), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop("immediate")
            except RuntimeError:
                pass
        if self.data_mb is not None:
            subprocess.run(["umount", "--lazy", str(self.data)], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, database: str = "postgres", *, password: str | None = PASSWORD) -> str:
        secret = f":{password}" if password is not None else ""
        return f"postgresql://{USER}{secret}@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database on this server; its name."""
        name = "t_" + uuid.uuid4().hex[:12]
        self.psql(f'CREATE DATABASE "{name}"')
        return name

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run `sql` through psql (the client binary beside the server); its output."""
        psql = shutil.which("psql") or str(self.bin / "psql")
        result = subprocess.run(
            [psql, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", sql,
             self.dsn(database)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr.strip()}")
        return result.stdout.strip()


def started_server(prefix: str = "tiergate-pg-", *, data_mb: int | None = None) -> PostgresServer:
    """A new running server in a fresh folder under the system's temp dir; its data directory
    `data_mb` MiB in size if given."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    server = PostgresServer(root, data_mb=data_mb)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    until(server.running, f"PostgreSQL did not listen on {server.port}", START_WITHIN_S)
    return server
