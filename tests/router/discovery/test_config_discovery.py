"""Router configuration and discovery: validation, the pool view's index, hot reload."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling_helpers import settled

from tiergate.common.tiers import Tier
from tiergate.router.config import ConfigError, parse_config
from tiergate.router.discovery.kube_state import pool_from_object
from tiergate.router.discovery.view import FileSource, build_pool, build_view
from tiergate.router.request.body import parse_completion
from tiergate.router.request.relay import capped
from tiergate.router.request.tier_choice import most_it_may_cost
from tiergate.router.tenants.registry import Tenant
from tiergate.sim_nodes.catalogs import default_catalog

POOLS = """
pools:
  - name: fr-batched
    tier: batched
    model: llama-3.1-8b
    servedModelName: coder
    accelerator: h100-sxm
    batching: {maxNumSeqs: 64}
    endpoints: [http://127.0.0.1:9000, http://127.0.0.1:9001/]
  - name: fr-premium
    tier: premium
    model: llama-3.1-8b
    servedModelName: coder
    accelerator: h100-sxm
    batching: {maxNumSeqs: 4}
    endpoints: [http://127.0.0.1:9002]
  - name: spark
    tier: wafer-scale
    model: llama-3.1-8b
    servedModelName: coder-spark
    aliases: [spark]
    accelerator: wse-3
    batching: {maxNumSeqs: 4}
    billing: {outputPerMillionUsd: 2.5}
    endpoints: [http://127.0.0.1:9003]
"""


def test_view_indexes_candidates_by_model_and_tier() -> None:
    view = build_view(parse_config(POOLS).pools, default_catalog())
    assert [e.url for e in view.candidates("coder", "batched")] == [
        "http://127.0.0.1:9000",
        "http://127.0.0.1:9001",
    ]
    assert view.candidates("coder", "wafer-scale") == ()
    # Each set says what all its members share, and finds one by URL (built once, here).
    batched = view.candidates("coder", "batched")
    assert (batched.model, batched.tier) == ("coder", "batched")
    assert batched.by_url["http://127.0.0.1:9001"] is batched[1]
    assert {(s.model, s.tier) for s in view.candidate_sets()} == {
        ("coder", "batched"),
        ("coder", "premium"),
        ("coder-spark", "wafer-scale"),
        ("spark", "wafer-scale"),
    }
    assert view.tiers_serving("coder") == ("batched", "premium")
    assert view.tiers_serving("spark") == ("wafer-scale",)
    assert view.models_served() == {
        "coder": ("batched", "premium"),
        "coder-spark": ("wafer-scale",),
        "spark": ("wafer-scale",),
    }


def test_the_view_holds_each_pool_s_replica_and_batch_cap_for_latency_prediction(
    tmp_path: Path,
) -> None:
    """What the router's latency predictions read (`PoolShapes`), computed once with the
    view: a hosted pool has no replica to model and takes what it may have open at once."""
    key = tmp_path / "key"
    key.write_text("sk-provider")
    hosted = (
        "  - {name: hosted, tier: batched, model: llama-3.1-8b, servedModelName: chat,"
        " billing: {outputPerMillionUsd: 1},"
        f" endpoint: {{url: 'http://127.0.0.1:9100/v1', model: m, apiKeyFile: '{key}',"
        " maxConcurrentRequests: 12}}\n"
    )
    view = build_view(parse_config(POOLS + hosted).pools, default_catalog())
    assert view.batch_cap("fr-batched") == 64 and view.batch_cap("spark") == 4
    assert view.batch_cap("hosted") == 12
    assert view.batch_cap("gone") is None and view.deployment("gone") is None
    assert view.deployment("hosted") is None
    spark = view.deployment("spark")
    assert spark is not None and spark is view.pools["spark"].deployment
    assert spark.accelerator.name == "wse-3"


def test_prices_come_from_the_envelope_unless_billing_overrides() -> None:
    view = build_view(parse_config(POOLS).pools, default_catalog())
    batched, premium, spark = (view.pools[n] for n in ("fr-batched", "fr-premium", "spark"))
    assert batched.output_price_per_token_usd == pytest.approx(
        batched.envelope.cost_per_million_output_tokens_usd / 1e6
    )
    # a smaller batch cap on the same hardware costs more per token
    assert premium.output_price_per_token_usd > 3 * batched.output_price_per_token_usd
    assert spark.output_price_per_token_usd == pytest.approx(2.5e-6)
    assert spark.cost_usd(1000, 2000) == pytest.approx(2000 * 2.5e-6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pools: [{name: a, tier: turbo, model: llama-3.1-8b, accelerator: h100-sxm}]", "tier"),
        ("pools: [{name: A_B, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]", "name"),
        (
            "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            "endpoints: [ftp://x]}]",
            "not an http",
        ),
        (
            "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            "colour: red}]",
            "Extra inputs",
        ),
        ("pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}, "
         "{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]", "used twice"),
        *(
            (
                "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
                f"endpoints: ['{url}']}}]",
                message,
            )
            for url, message in [
                ("http://127.0.0.1:99999", "Port out of range"),
                ("http://[::1", "Invalid IPv6"),
                ("http://a b", "no spaces"),
                ("http://", "needs a host"),
                ("http://127.0.0.1:9000/v1", "the router adds /v1"),
                ("http://u:p@127.0.0.1:9000", "credentials"),
                ("http://127.0.0.1:0", "port 0"),
            ]
        ),
        ("router: {scrapeIntervalS: .inf}", r"router\.scrapeIntervalS: .*finite"),
        ("router: {port: 9100, metricsPort: 9100}\npools: []",
         "metricsPort 9100 is also the router's port"),
        ("router: {metricsPort: 65536}\npools: []", r"router\.metricsPort"),
        ("pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
         "billing: {outputPerMillionUsd: .inf}}]", "finite"),
        ("pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
         "chips: eight}]", r"pools\.0\.chips: Input should be a valid integer"),
        ("pools: [\n  - {name: [}", "not valid YAML"),
        ("- 1\n- 2", "expected a mapping"),
    ],
)  # fmt: skip
def test_bad_config_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://ops:S3cret-pw@127.0.0.1:9000", "'http://***@127.0.0.1:9000': credentials"),
        ("http://ops:S3cret#pw@127.0.0.1:9000", "'http://***@127.0.0.1:9000' is not a URL"),
        ("http://127.0.0.1:9000/?token=S3cret-pw", "'http://127.0.0.1:9000/?***' must be"),
        ("ftp://ops:S3cret-pw@host", "'ftp://***@host' is not an http"),
    ],
)
def test_a_bad_endpoint_is_named_without_its_password_or_query(url: str, message: str) -> None:
    """The message reaches the log when a reload fails: what may be secret is left out."""
    text = (
        "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
        f"endpoints: ['{url}']}}]"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert message in str(caught.value) and "S3cret" not in str(caught.value)


def test_a_pool_that_does_not_fit_is_a_config_error() -> None:
    text = (
        "pools: [{name: big, tier: batched, model: llama-3.1-405b, accelerator: h100-sxm, "
        "chips: 1}]"
    )
    with pytest.raises(ConfigError, match="pool big: does not fit: weights need"):
        build_view(parse_config(text).pools, default_catalog())


def test_unknown_model_is_a_config_error() -> None:
    text = "pools: [{name: x, tier: batched, model: gpt-9, accelerator: h100-sxm}]"
    with pytest.raises(ConfigError, match="pool x: unknown model 'gpt-9'"):
        build_view(parse_config(text).pools, default_catalog())


def test_hot_reload_keeps_endpoint_state_and_survives_a_bad_edit(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(POOLS)
    source = FileSource(path, default_catalog())
    old = source.view.candidates("coder", "batched")[0]
    old.inflight = 3
    assert not source.reload_if_changed()  # unchanged content: nothing to do

    premium = "maxNumSeqs: 4}\n    endpoints: [http://127.0.0.1:9002]"
    path.write_text(POOLS.replace(premium, premium.replace("4}", "8}")))
    assert settled(source.reload_if_changed)
    assert source.view.candidates("coder", "batched")[0] is old  # state carried over
    assert source.view.pools["fr-premium"].spec.batching.max_num_seqs == 8

    before = source.view
    path.write_text("pools: [{name: x, tier: nope}]")
    assert not settled(source.reload_if_changed)
    assert source.view is before and source.file.reload_errors == 1

    path.write_text(POOLS.replace("http://127.0.0.1:9001/", "http://127.0.0.1:9005"))
    assert settled(source.reload_if_changed)
    urls = [e.url for e in source.view.candidates("coder", "batched")]
    assert urls == ["http://127.0.0.1:9000", "http://127.0.0.1:9005"]
    assert source.file.reloads == 2


def hosted_and_local(tmp_path: Path, *, provider_model: str, key: Path, local_model: str) -> str:
    """A hosted pool `a`, then a local pool `b` (whose model may not exist)."""
    return yaml.safe_dump({"pools": [
        {"name": "a", "tier": "batched", "model": "llama-3.1-8b", "servedModelName": "chat",
         "billing": {"outputPerMillionUsd": 1},
         "endpoint": {"url": "http://127.0.0.1:9100/v1", "model": provider_model,
                      "apiKeyFile": str(key)}},
        {"name": "b", "tier": "batched", "model": local_model, "accelerator": "h100-sxm",
         "servedModelName": "local", "endpoints": ["http://127.0.0.1:9000"]},
    ]})  # fmt: skip


def test_a_refused_reload_changes_nothing_the_router_sends(tmp_path: Path) -> None:
    """An edit moves pool a to another provider model and key, and names a model that does
    not exist for pool b: refused as a whole, pool a still sends what it sent, with its key."""
    old_key, new_key = tmp_path / "old-key", tmp_path / "new-key"
    old_key.write_text("sk-old")
    new_key.write_text("sk-new")
    path = tmp_path / "router.yaml"
    path.write_text(hosted_and_local(tmp_path, provider_model="gpt-old", key=old_key,
                                     local_model="llama-3.1-8b"))  # fmt: skip
    source = FileSource(path, default_catalog())
    before = source.view
    path.write_text(hosted_and_local(tmp_path, provider_model="gpt-new", key=new_key,
                                     local_model="no-such-model"))  # fmt: skip
    assert not settled(source.reload_if_changed)
    assert source.view is before and source.file.reload_errors == 1
    hosted = source.view.pools["a"].endpoints[0].hosted
    assert hosted is not None
    assert (hosted.model, hosted.key.value()) == ("gpt-old", "sk-old")


def test_a_reload_refused_for_a_file_not_there_yet_is_tried_again(tmp_path: Path) -> None:
    """A ConfigMap's volume is updated before the Secret's that holds the new pool's key: the
    reload fails, is logged once, and is tried again (after 1, 2, 4... looks) until the key
    is there, with no edit to the file."""
    key = tmp_path / "keys" / "provider-key"
    path = tmp_path / "router.yaml"
    path.write_text(POOLS)
    source = FileSource(path, default_catalog())
    path.write_text(hosted_and_local(tmp_path, provider_model="m", key=key,
                                     local_model="llama-3.1-8b"))  # fmt: skip
    assert not settled(source.reload_if_changed)
    tries = [source.reload_if_changed() for _ in range(6)]
    assert tries == [False] * 6 and source.file.reload_errors == 1
    assert set(source.view.pools) == {"fr-batched", "fr-premium", "spark"}
    key.parent.mkdir()
    key.write_text("sk-123")
    looks = 1
    while not source.reload_if_changed():
        looks += 1
        assert looks <= 8, "the refused content was not tried again"
    assert set(source.view.pools) == {"a", "b"} and source.file.reloads == 1


# -- inline profiles -------------------------------------------------------------------------


def inline_pool(name: str, **spec: Any) -> dict[str, Any]:
    model = default_catalog().model("llama-3.1-8b").model_copy(update={"name": "team-8b"})
    base = {"name": name, "tier": "batched", "model": "team-8b", "accelerator": "h100-sxm",
            "modelProfile": model.model_dump(by_alias=True, exclude_none=True),
            "batching": {"maxNumSeqs": 64}, "endpoints": ["http://127.0.0.1:9000"]}  # fmt: skip
    return {**base, **spec}


def test_a_pool_with_an_inline_model_is_routed_and_priced_from_it() -> None:
    reference = {"name": "ref", "tier": "batched", "model": "llama-3.1-8b",
                 "accelerator": "h100-sxm", "batching": {"maxNumSeqs": 64},
                 "endpoints": ["http://127.0.0.1:9001"]}  # fmt: skip
    text = yaml.safe_dump({"pools": [inline_pool("team"), reference]})
    view = build_view(parse_config(text).pools, default_catalog())
    team, ref = view.pools["team"], view.pools["ref"]
    assert view.tiers_serving("team-8b") == ("batched",)
    assert team.deployment.model.name == "team-8b"
    # a renamed copy of the catalog's model: the same numbers, so the same price
    assert team.output_price_per_token_usd == pytest.approx(ref.output_price_per_token_usd)
    assert "team-8b" not in default_catalog().models


def test_an_inline_accelerator_shadowing_the_catalog_sets_the_router_price() -> None:
    cheap = (
        default_catalog()
        .accelerator("h100-sxm")
        .model_copy(update={"price_per_chip_hour_usd": 2.99 / 2})
    )
    text = yaml.safe_dump({"pools": [
        inline_pool("published"),
        inline_pool("cheap", acceleratorProfile=cheap.model_dump(by_alias=True),
                    endpoints=["http://127.0.0.1:9002"]),
    ]})  # fmt: skip
    view = build_view(parse_config(text).pools, default_catalog())
    published, halved = view.pools["published"], view.pools["cheap"]
    assert halved.output_price_per_token_usd == pytest.approx(
        published.output_price_per_token_usd / 2
    )
    assert default_catalog().accelerator("h100-sxm").price_per_chip_hour_usd == 2.99


def test_an_inferencepool_object_with_an_inline_model_becomes_a_routed_pool() -> None:
    spec = {k: v for k, v in inline_pool("x").items() if k not in ("name", "endpoints")}
    obj = {"metadata": {"name": "team"}, "spec": spec}
    pool = build_pool(pool_from_object(obj, ["http://10.0.0.1:8000"]), default_catalog(),
                      ["http://10.0.0.1:8000"])  # fmt: skip
    assert pool.deployment.model.name == "team-8b" and pool.spec.names == ("team-8b",)
    mismatched = {**spec, "model": "team-7b"}
    with pytest.raises(ConfigError, match="modelProfile.name 'team-8b' must equal model"):
        pool_from_object({"metadata": {"name": "team"}, "spec": mismatched})


def test_a_file_caught_half_written_is_not_applied(tmp_path: Path) -> None:
    """`cat new.yaml > router.yaml` truncates, then writes: a look in between finds the first
    pool alone, which parses. Applied, it would drop the other pools for a reload interval."""
    path = tmp_path / "router.yaml"
    path.write_text(POOLS)
    source = FileSource(path, default_catalog())
    edited = POOLS.replace("maxNumSeqs: 64", "maxNumSeqs: 32")
    path.write_text(edited[: edited.index("  - name: fr-premium")])  # the first pool only
    assert not source.reload_if_changed()
    path.write_text(edited)  # the writer finishes before the next look
    assert not source.reload_if_changed()
    assert source.reload_if_changed()  # held still for one look: applied, whole
    assert set(source.view.pools) == {"fr-batched", "fr-premium", "spark"}
    assert source.view.pools["fr-batched"].spec.batching.max_num_seqs == 32
    assert source.file.reloads == 1 and source.file.reload_errors == 0


def test_the_file_is_polled_at_its_own_reload_interval(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("router: {reloadIntervalS: 30}\n" + POOLS)
    source = FileSource(path, default_catalog())
    assert source.poll_interval_s() == 30
    path.write_text("router: {reloadIntervalS: 0.25}\n" + POOLS)
    assert settled(source.reload_if_changed)
    assert source.poll_interval_s() == 0.25
    assert FileSource(path, default_catalog(), interval_s=0.05).poll_interval_s() == 0.05


def test_an_edit_to_a_pool_s_names_or_tier_keeps_its_endpoints_state(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(POOLS)
    source = FileSource(path, default_catalog())
    spark = source.view.candidates("spark", "wafer-scale")[0]
    spark.inflight, spark.ejected_until_s, spark.waiting = 2, 1e12, 5.0
    path.write_text(POOLS.replace("aliases: [spark]", "aliases: [spark, fast]"))
    assert settled(source.reload_if_changed)
    assert source.view.candidates("fast", "wafer-scale")[0] is spark
    assert (spark.inflight, spark.ejected_until_s, spark.waiting) == (2, 1e12, 5.0)
    assert spark.served_names == ("coder-spark", "spark", "fast")
    path.write_text(POOLS.replace("tier: wafer-scale", "tier: premium"))
    assert settled(source.reload_if_changed)
    assert source.view.candidates("spark", "premium")[0] is spark and spark.tier == "premium"
    assert source.view.candidates("spark", "wafer-scale") == ()


@pytest.mark.parametrize(
    ("sizes", "field"),
    [
        ({"totalParamsB": 1e300, "activeParamsB": 1e300}, "totalParamsB"),
        ({"hiddenSize": 10**7}, "hiddenSize"),
        ({"vocabSize": 10**8}, "no parameters left to compute with"),
    ],
    ids=["overflow", "division-by-zero", "all-embedding"],
)
def test_a_profile_beyond_any_model_is_a_config_error_naming_the_field(
    sizes: dict[str, Any], field: str
) -> None:
    """Sizes past any real model would overflow the performance model's arithmetic: refused
    with the rest of the file's checks, not left to fail in the middle of a prediction."""
    bad = inline_pool("absurd")
    bad["modelProfile"] = {**bad["modelProfile"], **sizes}
    with pytest.raises(ConfigError, match=r"pools\.0\.modelProfile") as caught:
        parse_config(yaml.safe_dump({"pools": [bad]}))
    assert field in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("order", [1, -1])
def test_a_name_only_previous_pods_answer_to_is_held_at_its_dearest_price(order: int) -> None:
    """Pool `b-dear` was renamed coder -> coder-v2; its old pod still answers to `coder`, which
    the cheap pool serves too. A budget holds the dearest price, whatever the pools' order."""
    config = parse_config(
        "pools:\n"
        "  - {name: a-cheap, tier: batched, model: llama-3.1-8b, accelerator: wse-3,"
        " servedModelName: coder, endpoints: ['http://a:1'],"
        " billing: {outputPerMillionUsd: 1, inputPerMillionUsd: 1}}\n"
        "  - {name: b-dear, tier: batched, model: llama-3.1-8b, accelerator: wse-3,"
        " servedModelName: coder-v2, endpoints: ['http://b-old:1', 'http://b-new:1'],"
        " billing: {outputPerMillionUsd: 100, inputPerMillionUsd: 100}}\n"
    )
    answers = {"b-dear": {"http://b-old:1": frozenset({"coder"})}}
    view = build_view(
        config.pools[::order], default_catalog(), answers_to=lambda s: answers.get(s.name, {})
    )
    assert sorted(e.url for e in view.candidates("coder", "batched")) == [
        "http://a:1",
        "http://b-old:1",
    ]
    assert [e.url for e in view.candidates("coder-v2", "batched")] == ["http://b-new:1"]
    assert view.most_cost_usd("coder", "batched", 1000, 1000) == pytest.approx(
        view.pools["b-dear"].cost_usd(1000, 1000)
    )
    assert view.models_served()["coder"] == ("batched",)


def test_a_batch_of_prompts_is_held_a_context_for_each_prompt() -> None:
    """A completions batch bills every prompt (as vLLM counts them), each up to the model's
    context: the hold covers the most such a batch may be billed (`capped`), not one context."""
    config = parse_config(
        "pools:\n"
        "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm,"
        " servedModelName: coder, endpoints: ['http://b:1'],"
        " billing: {outputPerMillionUsd: 10, inputPerMillionUsd: 1}}\n"
    )
    view = build_view(config.pools, default_catalog())
    pool = view.pools["b"]
    context = pool.max_context_tokens
    prompt = "word " * context  # about a context's tokens as the node counts them
    raw = json.dumps({"model": "coder", "prompt": [prompt] * 3, "max_tokens": 16}).encode()
    request = parse_completion(raw, chat=False)
    assert (request.prompts, request.sequences) == (3, 3)
    billed_at_most = pool.cost_usd(*capped(pool, request, 10**9, 10**9, say=False))
    tiers: list[Tier] = ["batched"]
    tenant = Tenant(name="t", budget_usd=100.0)
    hold = most_it_may_cost(view, request, None, tiers, tenant)
    assert hold == pytest.approx(billed_at_most)
    assert hold > 2 * pool.cost_usd(context, 3 * 16)  # more than one context of prompt
