"""Pools of one model and tier that serve contexts of different lengths (spec.maxContextTokens):
real sim nodes behind the real router, each on its own socket. A request longer than the short
pool's context is served by the other pool, never refused by the short one's engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

SHORT = 4096


def node(context: int | None) -> NodeConfig:
    serving = ServingSpec(
        model="llama-3.1-8b",
        accelerator="wse-3",
        batching=BatchingSpec(max_num_seqs=16),
        max_context_tokens=context,
    )
    return NodeConfig(serving=serving, served_model_names=["coder"])


def test_a_request_longer_than_one_pool_s_context_goes_to_the_pool_that_serves_it(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    with ExitStack() as stack:
        short = stack.enter_context(served(create_app(node(SHORT))))
        whole = stack.enter_context(served(create_app(node(None))))

        def pool(name: str, url: str, more: str) -> str:
            return (
                f"  - {{name: {name}, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
                f"servedModelName: coder, batching: {{maxNumSeqs: 16}}, "
                f"endpoints: {json.dumps([url])}{more}}}\n"
            )

        config = parse_config(
            f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}}}\npools:\n"
            + pool("short", short, f", maxContextTokens: {SHORT}")
            + pool("whole", whole, "")
        )
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        router = stack.enter_context(served(app))
        long_prompt = "word " * 6000  # more than 4,096 tokens however they are counted
        pools = []
        for _ in range(12):
            reply = httpx.post(
                router + "/v1/chat/completions",
                json={"model": "coder", "max_tokens": 2,
                      "messages": [{"role": "user", "content": long_prompt}]},
                timeout=60,
            )  # fmt: skip
            assert reply.status_code == 200, reply.text
            pools.append(reply.headers["x-tiergate-pool"])
        assert set(pools) == {"whole"}
