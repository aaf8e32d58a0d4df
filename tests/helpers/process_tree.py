"""Which processes run, and which of them holds the server's end of a TCP connection, read
from Linux's /proc (a uniquely named module: conftest names clash)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may hold spaces: the fields follow the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped, does not)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def children(pid: int) -> set[int]:
    """The live processes whose parent is `pid`."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.add(int(entry))
    return found


def server_end(client: socket.socket, pids: Iterable[int]) -> int:
    """The process among `pids` that holds the accepted socket of `client`'s connection (to a
    server on 127.0.0.1; the server has accepted it, e.g. it has answered a request)."""
    client_host, client_port = client.getsockname()[:2]
    server_host, server_port = client.getpeername()[:2]
    local, remote = _address(server_host, server_port), _address(client_host, client_port)
    inodes = [
        fields[9]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if (fields := line.split())[1] == local and fields[2] == remote
    ]
    assert inodes and inodes[0] != "0", f"no accepted socket for {client_host}:{client_port}"
    target = f"socket:[{inodes[0]}]"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pid
            except FileNotFoundError:
                continue
    raise AssertionError(f"none of {sorted(pids)} holds the server's end of the connection")


def _address(host: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the address's 32 bits in host order."""
    return f"{int.from_bytes(socket.inet_aton(host), sys.byteorder):08X}:{port:04X}"
