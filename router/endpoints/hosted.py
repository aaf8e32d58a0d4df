"""Where a hosted pool's requests go, and the provider's key they carry.

A hosted pool (`endpoint:` in a pool) is one endpoint: the provider's base URL. `HostedApi`
says what the proxy needs to send it a request: the URL of a path, the provider's model name,
and the key. The key is read when a request goes out (`ApiKey.value()`), from a file that is
read again when it changes (`FileKey`) or from the Secrets Kubernetes discovery keeps
(`SecretKey`), so a rotated key is used without a restart. A key is never part of a repr, a
log line or an error message: only where it comes from is.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tiergate.pools.hosted import DEFAULT_MAX_CONCURRENT_REQUESTS

__all__ = [
    "ApiKey",
    "FileKey",
    "HostedApi",
    "KeyUnavailable",
    "SecretKey",
    "SecretKeys",
    "in_pool_names",
]


class KeyUnavailable(Exception):
    """The provider's key cannot be had now; the message says where it was looked for."""


class ApiKey(Protocol):
    """A provider's API key, read when it is needed."""

    def value(self) -> str:
        """The key; KeyUnavailable when it cannot be read (never with the key in it)."""
        ...

    def describe(self) -> str:
        """Where the key comes from, for logs and errors."""
        ...


class FileKey:
    """A key in a file (a mounted Secret's key, say), read again when the file changes."""

    __slots__ = ("_lock", "_seen", "_value", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) read
        self._value: str | None = None
        self._lock = threading.Lock()

    def value(self) -> str:
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            with self._lock:
                if seen != self._seen or self._value is None:
                    text = self.path.read_text(encoding="utf-8").strip()
                    self._value, self._seen = text, seen
                key = self._value
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyUnavailable(f"cannot read {self.describe()}: {type(exc).__name__}") from None
        if not key:
            raise KeyUnavailable(f"{self.describe()} is empty")
        return key

    def describe(self) -> str:
        return f"the key file {self.path}"

    def __repr__(self) -> str:
        return f"FileKey({str(self.path)!r})"


class SecretKeys:
    """The keys of the Secrets hosted pools name, as Kubernetes discovery last read them.

    Written by discovery (`put`, `forget`), read on the request path (`get`)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str], str] = {}
        self._problems: dict[tuple[str, str], str] = {}

    def put(self, name: str, key: str, value: str) -> None:
        self._keys[name, key] = value
        self._problems.pop((name, key), None)

    def fail(self, name: str, key: str, problem: str, *, gone: bool) -> None:
        """Reading the Secret failed, and the problem is remembered. `gone`: the API server
        said the key is no more (the Secret deleted, the key removed from it, the router's
        grant to read it withdrawn), so the last value read is dropped and the provider is
        called no more; otherwise (the API server down, a timeout) that value stays in use,
        so an outage of Kubernetes' control plane does not stop a working pool."""
        self._problems[name, key] = problem
        if gone:
            self._keys.pop((name, key), None)

    def forget(self, keep: set[tuple[str, str]]) -> None:
        for ref in set(self._keys) - keep:
            del self._keys[ref]
        for ref in set(self._problems) - keep:
            del self._problems[ref]

    def get(self, name: str, key: str) -> str | None:
        return self._keys.get((name, key))

    def problem(self, name: str, key: str) -> str | None:
        return self._problems.get((name, key))

    def __repr__(self) -> str:
        return f"SecretKeys({len(self._keys)} keys)"


class SecretKey:
    """One key of a Secret, from the keys Kubernetes discovery reads."""

    __slots__ = ("key", "keys", "secret")

    def __init__(self, keys: SecretKeys, secret: str, key: str) -> None:
        self.keys, self.secret, self.key = keys, secret, key

    def value(self) -> str:
        found = self.keys.get(self.secret, self.key)
        if not found:
            why = self.keys.problem(self.secret, self.key) or "not read yet"
            raise KeyUnavailable(f"{self.describe()}: {why}")
        return found

    def describe(self) -> str:
        return f"key {self.key} of Secret {self.secret}"

    def __repr__(self) -> str:
        return f"SecretKey({self.secret!r}, {self.key!r})"


@dataclass(frozen=True, slots=True)
class HostedApi:
    """A provider's OpenAI-compatible API: where a pool's requests go, as what model, with
    which key."""

    base_url: str  # e.g. https://api.openai.com/v1: requests go to base_url + /chat/completions
    model: str  # the provider's name for the pool's model
    key: ApiKey
    timeout_s: float = 60.0  # for the reply to begin, and between two parts of it
    #: Requests the router may have open to it at once (the pool's maxConcurrentRequests).
    max_concurrent: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    #: The one field a chat request's output cap is sent in (the pool's outputCapField).
    cap_field: str = "max_completion_tokens"

    def full(self, inflight: int) -> bool:
        """Whether `inflight` open requests are as many as the provider may be sent."""
        return inflight >= self.max_concurrent

    def url(self, path: str) -> str:
        """The provider's URL of a router path (`/v1/chat/completions`: the base URL already
        says the API's version)."""
        return self.base_url + path.removeprefix("/v1")

    def headers(self) -> dict[str, str]:
        """The headers a request to the provider carries: its key, and nothing of the client's
        (KeyUnavailable when the key cannot be read)."""
        return {"content-type": "application/json", "authorization": f"Bearer {self.key.value()}"}


def in_pool_names(error: dict[str, Any], provider_model: str, client_model: str) -> None:
    """Say the name the client asked for wherever a provider's error object (its refusal, or
    an error event of its stream) names the provider's model, in every string in it, however
    deep: the client asked for one of the pool's names and is not to learn the provider's."""
    if provider_model:
        _renamed(error, provider_model, client_model)


def _renamed(value: Any, old: str, new: str) -> Any:
    """`value` with `old` replaced by `new` in its strings (dicts and lists changed in place)."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _renamed(item, old, new)
    elif isinstance(value, list):
        value[:] = [_renamed(item, old, new) for item in value]
    return value
