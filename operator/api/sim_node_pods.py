"""How a pool's sim-node pods are marked: the contract between the operator and the router.

The operator puts these labels and this port name on every sim-node pod it renders
(`operator/render.py`); the router finds a pool's endpoints by them (`router/kube_state.py`).
Spelled once, here, so the two sides cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "HTTP_PORT_NAME",
    "NAME_LABEL",
    "POOL_LABEL",
    "SIM_NODE_NAME",
    "SIM_NODE_SELECTOR",
    "label_selector",
    "pool_selector_labels",
]

#: The label naming the application a pod runs (`app.kubernetes.io/name`).
NAME_LABEL = "app.kubernetes.io/name"
#: Its value on every sim-node pod, whatever its pool.
SIM_NODE_NAME = "tiergate-sim-node"
#: The label naming the InferencePool a sim-node pod serves.
POOL_LABEL = "tiergate.dev/pool"
#: The container port the sim node serves on (probes and routed requests use it).
HTTP_PORT_NAME = "http"


def pool_selector_labels(pool: str) -> dict[str, str]:
    """The labels that select `pool`'s sim-node pods (they never change for a pool)."""
    return {NAME_LABEL: SIM_NODE_NAME, POOL_LABEL: pool}


def label_selector(labels: Mapping[str, str]) -> str:
    """The equality-based label selector (`k=v,k=v`) matching pods that carry all `labels`."""
    return ",".join(f"{key}={value}" for key, value in labels.items())


#: Every sim-node pod, of any pool: what the router lists and watches.
SIM_NODE_SELECTOR = label_selector({NAME_LABEL: SIM_NODE_NAME})
