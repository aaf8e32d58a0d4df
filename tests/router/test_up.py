"""`tiergate up`'s embedded default and the sim-node command lines it renders."""

from tiergate.cli import build_parser
from tiergate.router.cli.nodes import node_command
from tiergate.router.cli.up_cmd import default_config_text
from tiergate.router.config import parse_config
from tiergate.router.discovery import build_view
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.commands.sim_node_cmd import serving_spec


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
        args = build_parser("sim-node").parse_args(argv[argv.index("sim-node") :])
        spec, names = serving_spec(args)
        assert spec.chips == d.chips and spec.tensor_parallel == d.tensor_parallel
        assert spec.batching.max_num_seqs == pool.batching.max_num_seqs
        assert names == list(pool.names)
        if pool.background is not None:
            assert args.background_sequences == pool.background.sequences
            assert args.background_turn_input_tokens == pool.background.turn_input_tokens
