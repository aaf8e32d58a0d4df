"""How a pool's sim-node pods are marked: the contract between the operator and the router.

The operator puts these labels and this port name on every sim-node pod it renders
(`operator/render.py`); the router finds a pool's endpoints by them
(`router/discovery/kube_state.py`).
Spelled once, here, so the two sides cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

__all__ = [
    "HTTP_PORT_NAME",
    "NAME_LABEL",
    "POOL_LABEL",
    "SERVES_ANNOTATION",
    "SIM_NODE_NAME",
    "SIM_NODE_SELECTOR",
    "label_selector",
    "pool_selector_labels",
    "served_names",
    "serves_annotation",
]

#: The label naming the application a pod runs (`app.kubernetes.io/name`).
NAME_LABEL = "app.kubernetes.io/name"
#: Its value on every sim-node pod, whatever its pool.
SIM_NODE_NAME = "tiergate-sim-node"
#: The label naming the InferencePool a sim-node pod serves.
POOL_LABEL = "tiergate.dev/pool"
#: The container port the sim node serves on (probes and routed requests use it).
HTTP_PORT_NAME = "http"
#: The annotation listing the model names a sim-node pod answers to (a JSON array). A pod keeps
#: the names of the spec it was made from: during a rollout that changes the model or the
#: aliases, and after one that fails, the pool's pods do not all answer to the pool's names.
SERVES_ANNOTATION = "tiergate.dev/serves"


def pool_selector_labels(pool: str) -> dict[str, str]:
    """The labels that select `pool`'s sim-node pods (they never change for a pool)."""
    return {NAME_LABEL: SIM_NODE_NAME, POOL_LABEL: pool}


def label_selector(labels: Mapping[str, str]) -> str:
    """The equality-based label selector (`k=v,k=v`) matching pods that carry all `labels`."""
    return ",".join(f"{key}={value}" for key, value in labels.items())


#: Every sim-node pod, of any pool: what the router lists and watches.
SIM_NODE_SELECTOR = label_selector({NAME_LABEL: SIM_NODE_NAME})


def serves_annotation(names: Iterable[str]) -> str:
    """The value of `SERVES_ANNOTATION` for a pod answering to `names`."""
    return json.dumps(list(names), separators=(",", ":"))


def served_names(annotations: Mapping[str, object]) -> frozenset[str] | None:
    """The names a pod answers to, from its annotations; None when it does not say (a pod
    made before the annotation existed) or says it in a form this version cannot read."""
    raw = annotations.get(SERVES_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        names = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return frozenset(names)
