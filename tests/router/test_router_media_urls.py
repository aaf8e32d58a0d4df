"""Media URLs through the router, on a real sim node: a URL a node would fetch goes nowhere
unless the router allows its host; inline media always goes through."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
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

Served = Callable[[Any], AbstractContextManager[str]]


@pytest.fixture(scope="module")
def routers(
    tmp_path_factory: pytest.TempPathFactory, served: Served
) -> Iterator[dict[str, tuple[str, str]]]:
    """Two routers in front of one sim node: one with the default (no host allowed), one
    allowing a CDN's subdomains. Each: (its URL, the node's URL)."""
    tmp = tmp_path_factory.mktemp("media")
    node = NodeConfig(
        serving=ServingSpec(
            model="llama-3.1-8b", accelerator="h100-sxm", batching=BatchingSpec(max_num_seqs=8)
        ),
        served_model_names=["m"],
    )
    with ExitStack() as stack:
        node_url = stack.enter_context(served(create_app(node)))
        made = {}
        for name, extra in (("default", ""), ("cdn", ", allowedMediaDomains: ['*.cdn.example']")):
            text = (
                f"router: {{ledgerPath: {tmp / name}.sqlite{extra}}}\npools:\n"
                "  - {name: p, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
                f"servedModelName: m, endpoints: [{node_url}]}}\n"
            )
            config = parse_config(text)
            app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
            made[name] = (stack.enter_context(served(app)), node_url)
        yield made


def ask(router: str, url: str) -> httpx.Response:
    content = [{"type": "text", "text": "what is it?"},
               {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return httpx.post(router + "/v1/chat/completions", json=body, timeout=30)


def requests_served(node: str) -> float:
    text = httpx.get(node + "/metrics").text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def test_a_media_url_reaches_no_node_unless_its_host_is_allowed(
    routers: dict[str, tuple[str, str]],
) -> None:
    router, node = routers["default"]
    before = requests_served(node)
    refused = ask(router, "http://169.254.169.254/latest/meta-data/iam/")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("media_url_not_allowed", "messages")
    assert "'169.254.169.254'" in error["message"] and "meta-data" not in error["message"]
    assert requests_served(node) == before  # never sent on
    assert ask(router, "data:image/png;base64,iVBORw0KGgo=").status_code == 200

    router, node = routers["cdn"]
    assert ask(router, "https://img.cdn.example/cat.png").status_code == 200
    assert ask(router, "https://cdn.example.evil.io/cat.png").status_code == 400
    assert json.loads(ask(router, "file:///etc/passwd").text)["error"]["code"] == (
        "media_url_not_allowed"
    )
