"""`tiergate up`'s embedded default and the sim-node command lines it renders."""

import subprocess
import sys
import tempfile

import yaml

from tiergate.cli import build_parser
from tiergate.local.nodes import LocalNode, NodeSupervisor, node_command, stop_nodes
from tiergate.local.up_cmd import default_config_text, summary
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import build_view
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.commands.sim_node_cmd import replica_spec


def test_the_embedded_default_models_the_seed_tiers() -> None:
    config = parse_config(default_config_text())
    view = build_view(config.pools, default_catalog())
    by_tier = {p.spec.tier: p for p in view.pools.values()}
    assert set(by_tier) == {"batched", "premium", "wafer-scale"}
    batched, premium = by_tier["batched"], by_tier["premium"]
    speed = (
        premium.envelope.output_tokens_per_s_per_stream
        / batched.envelope.output_tokens_per_s_per_stream
    )
    price = premium.output_price_per_token_usd / batched.output_price_per_token_usd
    assert 2.1 < speed < 2.9 and 5 < price < 7
    assert by_tier["wafer-scale"].envelope.output_tokens_per_s_per_stream > 1000


def test_node_commands_ask_for_the_hardware_the_router_priced() -> None:
    config = parse_config(default_config_text())
    view = build_view(config.pools, default_catalog())
    for pool in config.pools:
        d = view.pools[pool.name].deployment
        argv = node_command(pool, d.chips, d.tensor_parallel, "127.0.0.1", 9000, seed=1)
        assert argv[argv.index("tiergate") + 1] == "sim-node"
        spec = replica_spec(build_parser("sim-node").parse_args(argv[argv.index("sim-node") :]))
        assert spec.chips == d.chips and spec.tensor_parallel == d.tensor_parallel
        assert spec.batching == pool.batching and spec.names == pool.names
        assert spec.background == pool.background


def test_a_local_pool_with_inline_profiles_starts_nodes_that_simulate_them() -> None:
    catalog = default_catalog()
    model = catalog.model("llama-3.1-8b").model_copy(update={"name": "team-8b"})
    chip = catalog.accelerator("h100-sxm").model_copy(update={"name": "lab-gpu"})
    text = yaml.safe_dump({"pools": [{
        "name": "team", "tier": "batched", "batching": {"maxNumSeqs": 8},
        "model": "team-8b", "modelProfile": model.model_dump(by_alias=True),
        "accelerator": "lab-gpu", "acceleratorProfile": chip.model_dump(by_alias=True),
    }]})  # fmt: skip
    config = parse_config(text)
    (pool,) = config.pools
    d = build_view(config.pools, catalog).pools["team"].deployment
    argv = node_command(pool, d.chips, d.tensor_parallel, "127.0.0.1", 9000, seed=1)
    spec = replica_spec(build_parser("sim-node").parse_args(argv[argv.index("sim-node") :]))
    assert (spec.model_profile, spec.accelerator_profile) == (model, chip)


def test_the_summary_marks_inline_profiles() -> None:
    catalog = default_catalog()
    cheap = catalog.accelerator("h100-sxm").model_copy(update={"price_per_chip_hour_usd": 1.0})
    text = yaml.safe_dump({"pools": [{
        "name": "cheap", "tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm",
        "acceleratorProfile": cheap.model_dump(by_alias=True),
    }]})  # fmt: skip
    row = summary(
        build_view(parse_config(text).pools, catalog), "http://x", "http://y/metrics"
    ).splitlines()[2]
    assert " x h100-sxm (inline profile, shadowing the catalog entry)" in row
    assert "llama-3.1-8b (inline" not in row


def test_the_supervisor_restarts_a_crashed_node_and_leaves_one_that_was_stopped() -> None:
    pool = parse_config(
        "pools: [{name: p, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]"
    ).pools[0]

    def node(code: int) -> LocalNode:
        command = [sys.executable, "-c", f"import sys; sys.exit({code})"]
        stderr = tempfile.TemporaryFile()
        process = subprocess.Popen(command, stderr=stderr)
        process.wait()
        return LocalNode(pool, f"http://127.0.0.1:{9000 + code}", command, process, stderr)

    crashed, stopped, interrupted = node(1), node(0), node(130)
    supervisor = NodeSupervisor([crashed, stopped, interrupted], backoff_s=1.0)
    supervisor.check(now=0.0)  # noted, restart due at 1 s
    assert crashed.restarts == 0
    supervisor.check(now=1.0)
    assert crashed.restarts == 1 and stopped.restarts == 0 and interrupted.restarts == 0
    crashed.process.wait()
    supervisor.check(now=2.0)  # crashed again: the next wait doubles
    supervisor.check(now=3.5)
    assert crashed.restarts == 1
    supervisor.check(now=4.0)
    assert crashed.restarts == 2
    stop_nodes([crashed, stopped, interrupted])
