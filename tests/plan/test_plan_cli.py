"""`tiergate plan` as a user meets it: bad input is one line and exit 2, an SLO nothing meets
is the closest configuration and exit 1, --json is the report, --emit-pools writes pools the
CRD accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_helpers import generated_crd, problems
from plan_helpers import tiny_plan, write_plan

from tiergate.cli import main
from tiergate.plan import PlanReport
from tiergate.pools import InferencePool

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def changed(**top: Any) -> dict[str, Any]:
    data = tiny_plan()
    for key, value in top.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


BAD: dict[str, tuple[Any, str]] = {
    "not a mapping": ("- a list", "expected a mapping"),
    "bad yaml": ("tiers: {batched: [", "not valid YAML (line"),
    "unknown tier": (changed(tiers={"gold": tiny_plan()["tiers"]["batched"]}), "tiers.gold"),
    "no rate": (
        changed(tiers={"batched": {"model": "llama-3.1-8b", "slo": {"ttftMs": 1, "tpotMs": 1}}}),
        "ratePerS is required",
    ),
    "bad length": (tiny_plan(outputTokens="lognormal:x:1"), "outputTokens"),
    "percentile 100": (
        tiny_plan(slo={"percentile": 100, "ttftMs": 100, "tpotMs": 10}),
        "percentile",
    ),
    "unknown field": (tiny_plan(rps=3), "rps"),
    "unknown model": (tiny_plan(model="gpt-9"), "unknown model 'gpt-9'"),
    "unknown accelerator": (
        changed(search={"accelerators": ["tpu-v9"]}),
        "unknown accelerator 'tpu-v9'",
    ),
    "premium caps above its cap": (
        changed(
            tiers={"premium": tiny_plan()["tiers"]["batched"]}, search={"batchCaps": [64, 128]}
        ),
        "maxNumSeqs to 16 or less",
    ),
    "wafer-scale on GPUs": (
        changed(
            tiers={"wafer-scale": tiny_plan()["tiers"]["batched"]},
            search={"accelerators": ["h100-sxm"]},
        ),
        "wafer-scale pools need an SRAM accelerator",
    ),
    "longer than the context": (
        tiny_plan(promptTokens="200000"),
        "exceeds the 131072-token context",
    ),
    "trace and rate": (changed(trace="t.jsonl"), "the trace sets the rate"),
    "bad name": (changed(name="Not_A_Label"), "name"),
}


@pytest.mark.parametrize("data, expected", BAD.values(), ids=BAD.keys())
def test_bad_plans_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: Any, expected: str
) -> None:
    path = tmp_path / "plan.yaml"
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        write_plan(tmp_path, data)
    code, out, err = run(capsys, str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tiergate plan: error: "), err
    assert expected in err


def test_a_missing_plan_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "/nonexistent/plan.yaml")
    assert code == 2 and err.count("\n") == 1 and "cannot read plan" in err


BAD_TRACES = {
    "not json": ("{", "line 1: not JSON"),
    "no tier": ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5}', "line 1: tier"),
    "cached all": (
        '{"arrival_s": 0, "tier": "batched", "prompt_tokens": 5, "output_tokens": 5, '
        '"cached_prompt_tokens": 5}',
        "line 1: cached_prompt_tokens must be below prompt_tokens",
    ),
    "too few": (
        '{"arrival_s": 0, "tier": "batched", "prompt_tokens": 5, "output_tokens": 5}',
        "1 request(s) of tier batched",
    ),
}


@pytest.mark.parametrize("text, expected", BAD_TRACES.values(), ids=BAD_TRACES.keys())
def test_bad_traces_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    (tmp_path / "t.jsonl").write_text(text + "\n", encoding="utf-8")
    data = tiny_plan()
    data["trace"] = "t.jsonl"
    del data["tiers"]["batched"]["ratePerS"]
    code, _, err = run(capsys, str(write_plan(tmp_path, data)))
    assert code == 2 and err.count("\n") == 1 and expected in err, err


def test_an_slo_nothing_meets_gives_the_closest_configuration_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tiny_plan(slo={"percentile": 90, "ttftMs": 300, "tpotMs": 0.5})
    code, out, err = run(capsys, str(write_plan(tmp_path, data)), "--no-progress")
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("tiergate plan: tier batched: no configuration meets p90 TTFT <= 300")
    assert "closest: " in err and "TPOT p90" in err
    assert "closest" in out and "NOT MET" in out
    code, out, _ = run(capsys, str(write_plan(tmp_path, data)), "--json")
    report = PlanReport.model_validate_json(out)
    tier = report.tiers[0]
    assert code == 1 and not report.met and tier.plan is None
    assert tier.closest is not None and not tier.closest.meets_slo
    assert tier.closest.tpot_p90_s is not None and tier.closest.tpot_p90_s > 0.0005


def test_json_is_the_report_and_pools_validate_and_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools = tmp_path / "pools"
    code, out, err = run(
        capsys, str(write_plan(tmp_path, tiny_plan())), "--json", "--emit-pools", str(pools)
    )
    assert code == 0
    report = PlanReport.model_validate(json.loads(out))
    tier = report.tiers[0]
    assert report.met and tier.plan is not None
    [path] = sorted(pools.glob("*.yaml"))
    assert path.name == "tiny-batched.yaml" and f"wrote {path}" in err
    manifest = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert problems(generated_crd(), manifest) == []
    pool = InferencePool.model_validate(manifest)
    c = tier.plan.configuration
    assert pool.spec.tier == "batched" and pool.spec.replicas == tier.plan.replicas
    assert (pool.spec.model, pool.spec.accelerator, pool.spec.chips) == (
        c.model,
        c.accelerator,
        c.chips,
    )
    assert pool.spec.tensor_parallel == c.tensor_parallel
    assert pool.spec.batching.max_num_seqs == c.max_num_seqs
    assert pool.spec.slo is not None and pool.spec.slo.tpot_ms == tier.slo_tpot_ms
    dumped = pool.model_dump(by_alias=True, exclude_unset=True, mode="json")
    assert InferencePool.model_validate(dumped) == pool


def test_autoscaled_pools_follow_their_load_up_to_the_planned_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools = tmp_path / "pools"
    plan = str(write_plan(tmp_path, tiny_plan()))
    code, out, err = run(capsys, plan, "--json", "--emit-pools", str(pools), "--autoscale")
    assert code == 0, err
    planned = PlanReport.model_validate(json.loads(out)).tiers[0].plan
    manifest = yaml.safe_load((pools / "tiny-batched.yaml").read_text(encoding="utf-8"))
    assert problems(generated_crd(), manifest) == []
    autoscaling = InferencePool.model_validate(manifest).spec.autoscaling
    assert planned is not None and autoscaling is not None
    assert (autoscaling.min_replicas, autoscaling.max_replicas) == (1, planned.replicas)
    code, out, err = run(capsys, plan, "--autoscale")
    assert (code, out) == (2, "") and "--autoscale needs --emit-pools" in err


def test_a_trace_with_a_tier_per_request_is_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        {"arrival_s": i / 40, "tier": "batched", "prompt_tokens": 400, "output_tokens": 60}
        for i in range(400)
    ]
    lines += [{"arrival_s": 1.0, "tier": "premium", "prompt_tokens": 9, "output_tokens": 9}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    data = tiny_plan()
    data["trace"] = "t.jsonl"
    del data["tiers"]["batched"]["ratePerS"]
    code, out, _ = run(capsys, str(write_plan(tmp_path, data)), "--json")
    tier = PlanReport.model_validate_json(out).tiers[0]
    assert code == 0 and tier.tier == "batched" and tier.met
    assert tier.rate_per_s == pytest.approx(40.0)
    assert tier.requests_simulated == 400 and tier.mean_prompt_tokens == 400


def test_premium_and_wafer_scale_plans_follow_their_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tiny_plan(ratePerS=10, slo={"percentile": 90, "ttftMs": 500, "tpotMs": 20})
    data["tiers"]["premium"] = dict(data["tiers"].pop("batched"))
    data["tiers"]["wafer-scale"] = dict(data["tiers"]["premium"])
    data["search"]["accelerators"] = ["h100-sxm", "wse-3"]
    data["simulation"]["requests"] = 200
    code, out, _ = run(
        capsys, str(write_plan(tmp_path, data)), "--json", "--emit-pools", str(tmp_path)
    )
    report = PlanReport.model_validate_json(out)
    assert code == 0
    by_tier = {t.tier: t.plan for t in report.tiers}
    premium, wafer = by_tier["premium"], by_tier["wafer-scale"]
    assert premium is not None and premium.configuration.max_num_seqs <= 16
    assert wafer is not None and wafer.configuration.accelerator == "wse-3"
    for path in tmp_path.glob("tiny-*.yaml"):
        assert problems(generated_crd(), yaml.safe_load(path.read_text(encoding="utf-8"))) == []
