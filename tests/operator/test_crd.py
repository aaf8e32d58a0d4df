"""The generated CRD: matches the committed YAML, is structural, and its validation (schema and
CEL rules) refuses bad pools with readable messages while accepting the examples."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_helpers import generated_crd, problems, schema_of, walk
from pydantic import ValidationError

from tiergate.common.tiers import DEFINITIONS, TIERS, batch_cap_problem
from tiergate.common.validation import first_problem
from tiergate.operator.commands.crds_cmd import FILE_NAME, TARGETS, render
from tiergate.operator.crd import tier_rules
from tiergate.pools import InferencePoolSpec, pool_name_problem
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.tier_rules import memory_problem

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: Every InferencePool example: those `kubectl apply -f examples/` creates, and those in folders
#: of their own (they need something first: a Secret, a metrics pipeline).
EXAMPLES = [
    p
    for pattern in ("*.yaml", "autoscaling/*.yaml", "hosted/*.yaml")
    for p in sorted((ROOT / "examples").glob(pattern))
]


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return generated_crd()


@pytest.mark.parametrize("folder", TARGETS, ids=str)
def test_committed_crd_is_what_the_models_generate(folder: Path) -> None:
    committed = (ROOT / folder / FILE_NAME).read_text(encoding="utf-8")
    assert committed == render(), "stale CRD: run `tiergate crds`"


def test_crds_check_fails_on_drift(tmp_path: Path) -> None:
    for folder in TARGETS:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / FILE_NAME).write_text(render() + "# edited\n", encoding="utf-8")
    cmd = [sys.executable, "-P", "-m", "tiergate", "crds", "--check", "--root", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and "stale" in done.stdout


def test_schema_is_structural_and_documented(crd: dict[str, Any]) -> None:
    for path, node in walk(schema_of(crd)):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title"} & node.keys(), path
        # Defaults are the operator's to apply, except the one the scale subresource needs.
        assert "default" not in node or path == ".spec.replicas", path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        if path.startswith((".spec", ".status")) and not path.endswith(("[]", "{}")):
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_subresources_and_printer_columns(crd: dict[str, Any]) -> None:
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert version["subresources"]["status"] == {}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[:9] == ["Tier", "Model", "Accelerator", "Replicas", "Ready", "Tok/s",
                         "$/Mtok", "Billed$/Mtok", "Age"]  # fmt: skip
    desired = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Desired")
    assert desired == {"name": "Desired", "type": "integer", "priority": 1,
                       "jsonPath": ".status.autoscaling.desiredReplicas"}  # fmt: skip
    assert crd["spec"]["names"]["plural"] == "inferencepools"


# -- validation as the API server does it: OpenAPI schema, then CEL rules ---------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_are_accepted(crd: dict[str, Any], path: Path) -> None:
    assert problems(crd, yaml.safe_load(path.read_text(encoding="utf-8"))) == []


def bad(change: dict[str, Any]) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "examples" / "premium.yaml").read_text(encoding="utf-8"))
    spec = copy.deepcopy(obj["spec"])
    for key, value in change.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return {**obj, "spec": spec}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batching": {"maxNumSeqs": 64}}, "premium pools serve a small batch"),
        ({"batching": None}, "premium pools serve a small batch"),
        ({"tier": "wafer-scale", "accelerator": "h100-sxm"}, "need an SRAM accelerator"),
        ({"tensorParallel": 3}, "tensorParallel must divide spec.chips"),
        ({"chips": 0}, 'positive integer or "auto"'),
        ({"chips": "many"}, 'positive integer or "auto"'),
        ({"tier": "turbo"}, "'turbo' is not one of"),
        ({"replicas": -1}, "less than the minimum of 0"),
        ({"replicas": 2**31}, "greater than the maximum of 2147483647"),
        # Label values and quantities as Kubernetes checks them (keys: the API server's).
        ({"template": {"labels": {"team": "team a"}}}, "'team a' does not match"),
        ({"template": {"nodeSelector": {"pool": "x" * 64}}}, "is too long"),
        ({"template": {"resources": {"limits": {"cpu": "two"}}}}, "'two' does not match"),
        ({"weightDtype": "fp16"}, "'fp16' is not one of"),
        ({"model": None}, "'model' is a required property"),
        ({"aliases": ["fast", ""]}, "'' should be non-empty"),
        ({"servedModelName": "-fast"}, "spec.servedModelName must not start with '-'"),
        ({"modelSource": "--weights"}, "spec.modelSource must not start with '-'"),
    ],
)
def test_bad_pools_are_refused_with_a_readable_message(
    crd: dict[str, Any], change: dict[str, Any], message: str
) -> None:
    found = problems(crd, bad(change))
    assert any(message in p for p in found), found


@pytest.mark.parametrize(
    ("name", "refused"),
    [("a" * 63, False), ("a" * 64, True), ("1digit", True), ("dotted.pool", True),
     ("ends-", True), ("frontier-premium-2", False)],
)  # fmt: skip
def test_pool_names_must_make_service_names(crd: dict[str, Any], name: str, refused: bool) -> None:
    obj = bad({})
    obj["metadata"] = {**obj["metadata"], "name": name}
    found = problems(crd, obj)
    assert bool(found) == refused, found
    assert all("InferencePool's name" in p for p in found)
    # `tiergate render` refuses the same names, with the same words.
    assert found == ([] if pool_name_problem(name) is None else [pool_name_problem(name)])


def test_replicas_default_to_one_in_the_schema_for_the_scale_subresource(
    crd: dict[str, Any],
) -> None:
    assert schema_of(crd)["properties"]["spec"]["properties"]["replicas"]["default"] == 1


# -- inline profiles ---------------------------------------------------------------------------


def custom(field: str, profile: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """examples/custom-model.yaml with `spec.<field>` changed (None: left out)."""
    obj = yaml.safe_load((ROOT / "examples" / "custom-model.yaml").read_text(encoding="utf-8"))
    obj["spec"].update(spec)
    if profile is None:
        obj["spec"].pop(field, None)
    else:
        obj["spec"][field] = profile
    return obj


def model_profile(**changes: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "examples" / "custom-model.yaml").read_text(encoding="utf-8"))
    profile: dict[str, Any] = obj["spec"]["modelProfile"]
    for key, value in changes.items():
        if value is None:
            profile.pop(key)
        else:
            profile[key] = value
    return profile


def accelerator_profile(name: str, source: str, **changes: Any) -> dict[str, Any]:
    profile = default_catalog().accelerator(source).model_copy(update={"name": name})
    return {**profile.model_dump(by_alias=True, exclude_none=True), **changes}


def test_inline_profiles_are_accepted_and_an_inline_sram_chip_may_be_wafer_scale(
    crd: dict[str, Any],
) -> None:
    wafer = custom(
        "acceleratorProfile", accelerator_profile("lab-wafer", "wse-3"),
        tier="wafer-scale", accelerator="lab-wafer",
    )  # fmt: skip
    assert problems(crd, wafer) == []
    shadowing = custom(
        "acceleratorProfile", accelerator_profile("h100-sxm", "h100-sxm", pricePerChipHourUsd=1.0)
    )
    assert problems(crd, shadowing) == []


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (custom("modelProfile", model_profile(hiddenSize=None)),
         "'hiddenSize' is a required property"),
        (custom("modelProfile", model_profile(name="team-7b")),
         "spec.modelProfile.name must equal spec.model"),
        (custom("modelProfile", model_profile(kvHeads=6)),
         "modelProfile.heads must be a multiple of modelProfile.kvHeads"),
        (custom("modelProfile", model_profile(activeParamsB=80)),
         "activeParamsB must not exceed modelProfile.totalParamsB"),
        (custom("modelProfile", model_profile(layers=0)), "less than the minimum of 1"),
        (custom("acceleratorProfile", accelerator_profile("h100-sxm", "h100-sxm",
                                                          peakTflops={"fp8": 1979})),
         "acceleratorProfile.peakTflops needs a bf16 entry"),
        (custom("acceleratorProfile", accelerator_profile("lab-gpu", "h100-sxm")),
         "spec.acceleratorProfile.name must equal spec.accelerator"),
        # an inline profile is judged by its own memory, whatever name it borrows
        (custom("acceleratorProfile", accelerator_profile("lab-gpu", "h100-sxm"),
                tier="wafer-scale", accelerator="lab-gpu"), "need an SRAM accelerator"),
        (custom("acceleratorProfile", accelerator_profile("wse-3", "h100-sxm"),
                tier="wafer-scale", accelerator="wse-3"), "need an SRAM accelerator"),
    ],
)  # fmt: skip
def test_bad_inline_profiles_are_refused_naming_the_field(
    crd: dict[str, Any], obj: dict[str, Any], message: str
) -> None:
    found = problems(crd, obj)
    assert any(message in p for p in found), found


# -- tier rules: the CRD's CEL and the pydantic models refuse the same pools, in the same words --


def tier_rule_problem(obj: dict[str, Any]) -> str | None:
    """What the pydantic spec (pool files, `tiergate up`, `tiergate router`) says of `obj`."""
    try:
        InferencePoolSpec.model_validate(obj["spec"])
    except ValidationError as exc:
        return first_problem(exc)
    return None


@pytest.mark.parametrize(
    "obj",
    [
        bad({}),
        bad({"batching": {"maxNumSeqs": 16}}),
        bad({"batching": {"maxNumSeqs": 17}}),
        bad({"batching": {"maxNumSeqs": 256}}),
        bad({"batching": None}),
        bad({"tier": "batched", "batching": {"maxNumSeqs": 256}}),
        bad({"tier": "wafer-scale", "accelerator": "h100-sxm", "batching": {"maxNumSeqs": 8}}),
        bad({"tier": "wafer-scale", "accelerator": "wse-3", "batching": {"maxNumSeqs": 8}}),
        bad({"tier": "wafer-scale", "accelerator": "no-such-chip"}),
        custom(
            "acceleratorProfile",
            accelerator_profile("lab-wafer", "wse-3"),
            tier="wafer-scale",
            accelerator="lab-wafer",
        ),
        custom(
            "acceleratorProfile",
            accelerator_profile("lab-gpu", "h100-sxm"),
            tier="wafer-scale",
            accelerator="lab-gpu",
        ),
        custom(
            "acceleratorProfile",
            accelerator_profile("wse-3", "h100-sxm"),
            tier="wafer-scale",
            accelerator="wse-3",
        ),
    ],  # fmt: skip
    ids=lambda obj: (
        f"{obj['spec']['tier']}-{obj['spec']['accelerator']}-"
        f"{obj['spec'].get('batching', {}).get('maxNumSeqs')}"
    ),
)
def test_cel_and_pydantic_refuse_the_same_pools_for_their_tier(
    crd: dict[str, Any], obj: dict[str, Any]
) -> None:
    tier_messages = [
        p for p in problems(crd, obj) if p in {r["message"] for r in tier_rules(default_catalog())}
    ]
    said = tier_rule_problem(obj)
    if not tier_messages:
        assert said is None or "pools" not in said, said
    else:
        assert said is not None and said.endswith(tier_messages[0]), (said, tier_messages)


def test_every_tier_rule_of_the_definitions_is_in_the_crd(crd: dict[str, Any]) -> None:
    spec = schema_of(crd)["properties"]["spec"]
    stated = [r["message"] for r in spec["x-kubernetes-validations"]]
    for tier in DEFINITIONS.values():
        for problem in (batch_cap_problem(tier.name), memory_problem(tier.name, default_catalog())):
            assert problem is None or problem in stated, problem
    assert spec["properties"]["tier"]["enum"] == list(TIERS)


#: A quoted CEL string literal (group 1: its prefix, r or R when raw; group 2: its body).
_CEL_STRING = re.compile(r"""([rRbB]*)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
#: The escapes CEL's quoted strings define (the CEL spec's string literals).
_CEL_ESCAPE = re.compile(
    r"""\\(?:[\\?"'`abfnrtv]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-3][0-7]{2})"""
)


def cel_escape_problems(rule: str) -> list[str]:
    """Escapes in `rule`'s non-raw string literals that CEL does not define."""
    found = []
    for prefix, literal in _CEL_STRING.findall(rule):
        if "r" in prefix.lower():
            continue
        body = _CEL_ESCAPE.sub("", literal[1:-1])
        found += [f"\\{m}" for m in re.findall(r"\\(.)", body)]
    return found


def test_every_cel_rule_uses_only_escapes_cel_defines(crd: dict[str, Any]) -> None:
    """cel-python (these tests' evaluator) reads escapes the API server's CEL refuses."""
    rules = [
        (path, r["rule"])
        for path, node in walk(schema_of(crd))
        for r in node.get("x-kubernetes-validations", [])
    ]
    assert rules
    bad = {rule: cel_escape_problems(rule) for _, rule in rules if cel_escape_problems(rule)}
    assert not bad, bad
    assert cel_escape_problems(r"self.url.matches('^[^\s]+$')") == ["\\s"]
    assert cel_escape_problems(r"self.url.matches(r'^[^\s]+$') && self.a == 'it\'s'") == []
