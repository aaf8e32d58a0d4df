"""The simulated accelerator node: an OpenAI-compatible server over the batching engine.

`create_app(NodeConfig(...))` builds the Starlette app; `tiergate sim-node` serves it with
uvicorn. Metrics use vLLM's names so routers built for vLLM can read a sim node.
"""

from .app import NODE_HEADER, TIMING_HEADER, create_app, running
from .config import NodeConfig, PoolFileError, load_pool_spec
from .errors import ApiError
from .faults import FAULT_HEADER
from .node import Node

__all__ = [
    "FAULT_HEADER",
    "NODE_HEADER",
    "TIMING_HEADER",
    "ApiError",
    "Node",
    "NodeConfig",
    "PoolFileError",
    "create_app",
    "load_pool_spec",
    "running",
]
