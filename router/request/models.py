"""The reply of `GET /v1/models`: the model names the pools serve now, each with its tiers (on
the router's port, and through the endpoint picker's gateway: there, those of pools of pods)."""

from __future__ import annotations

from typing import Any

from tiergate.router.discovery.view import PoolView

__all__ = ["models_reply"]


def models_reply(view: PoolView, *, hosted: bool = True) -> dict[str, Any]:
    """OpenAI's model list, with the tiers that serve each name (`hosted=False`: through a
    gateway, which reaches pools of pods alone)."""
    data = [
        {"id": name, "object": "model", "owned_by": "tiergate", "tiers": list(tiers)}
        for name, tiers in sorted(view.models_served(hosted=hosted).items())
    ]
    return {"object": "list", "data": data}
