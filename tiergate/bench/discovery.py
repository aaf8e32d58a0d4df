"""Which model each tier's requests ask for: `--model`, or the router's `GET /v1/models`.

tiergate's router lists every model with the tiers serving it (an extra `tiers: [...]` field
per entry); a plain OpenAI-compatible server does not, and then its first model is used for
every tier. The same call doubles as the reachability check: an unreachable URL or a refused
API key stops the bench before any load is sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from tiergate.bench.errors import BenchError

__all__ = ["ServedModel", "choose_models", "discover_models", "parse_model_list"]


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One entry of `GET /v1/models`; `tiers` is None when the server does not say."""

    id: str
    tiers: tuple[str, ...] | None


async def discover_models(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    key_hint: str | None = None,
) -> list[ServedModel] | None:
    """The served models, or None when the server has no usable model list.

    Raises BenchError when the server cannot be reached or refuses the API key (the message
    then ends with `key_hint`, what to do about it: by default, pass --api-key).
    """
    try:
        response = await client.get("/v1/models")
    except httpx.TimeoutException:
        raise BenchError(f"cannot reach {base_url}: timed out") from None
    except httpx.ConnectError as exc:
        raise BenchError(
            f"cannot connect to {base_url} ({exc or 'connection refused'}); is it running?"
        ) from None
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {base_url}: {exc or type(exc).__name__}") from None
    if response.status_code in (401, 403):
        raise BenchError(
            f"{base_url} refused the API key ({response.status_code}): "
            f"{_error_message(response)}; "
            f"{key_hint or 'pass --api-key or set TIERGATE_API_KEY'}"
        )
    if response.status_code != 200:
        return None
    try:
        return parse_model_list(response.json())
    except ValueError:
        return None


def parse_model_list(data: Any) -> list[ServedModel]:
    """The entries of an OpenAI model list (raises ValueError for another shape)."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError("not an OpenAI model list")
    models = []
    for entry in data["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        tiers = entry.get("tiers")
        listed = tuple(t for t in tiers if isinstance(t, str)) if isinstance(tiers, list) else None
        models.append(ServedModel(entry["id"], listed))
    return models


def choose_models(
    tiers: Iterable[str], explicit: str | None, served: list[ServedModel] | None, base_url: str
) -> dict[str, str]:
    """The model of each tier: `explicit`, else one the server says the tier serves, else the
    server's first model. Raises BenchError when that cannot be decided."""
    tiers = list(tiers)
    if explicit is not None:
        return {tier: explicit for tier in tiers}
    if not served:
        raise BenchError(f"{base_url} lists no models at GET /v1/models; pass --model NAME")
    if all(m.tiers is None for m in served):
        return {tier: served[0].id for tier in tiers}
    chosen = {}
    for tier in tiers:
        model = next((m.id for m in served if m.tiers is not None and tier in m.tiers), None)
        if model is None:
            listing = ", ".join(f"{m.id} [{' '.join(m.tiers or ())}]" for m in served)
            raise BenchError(
                f"no model of {base_url} is served in tier {tier} (models: {listing}); "
                "drop the tier from --mix or pass --model NAME"
            )
        chosen[tier] = model
    return chosen


def _error_message(response: httpx.Response) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:200].strip() or "no message"
    return str(message)
