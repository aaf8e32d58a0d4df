"""The plugin registry and PolicyConfig validation: errors name the plugin."""

import pytest
from pydantic import ValidationError

from tiergate.router.policy import (
    NoParameters,
    PluginContext,
    PolicyConfig,
    PolicyConfigError,
    Scorer,
    default_policy,
    known_types,
    register,
)
from tiergate.router.policy.registry import build_plugin

BUILT_IN = {
    "model-filter": "filter",
    "tier-filter": "filter",
    "context-filter": "filter",
    "ejected-filter": "filter",
    "random-sample": "filter",
    "queue-depth-scorer": "scorer",
    "kv-cache-utilization-scorer": "scorer",
    "prefix-affinity-scorer": "scorer",
    "predicted-latency-scorer": "scorer",
    "max-score-picker": "picker",
    "weighted-random-picker": "picker",
}


def test_every_built_in_type_is_registered_by_kind() -> None:
    for kind in ("filter", "scorer", "picker"):
        expected = {name for name, k in BUILT_IN.items() if k == kind}
        assert expected <= set(known_types(kind))


def test_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(ValidationError) as info:
        PolicyConfig.model_validate({"scorers": [{"name": "q", "type": "queue-scorer"}]})
    message = str(info.value)
    assert "scorer 'q': unknown type 'queue-scorer'" in message
    assert "queue-depth-scorer" in message and "prefix-affinity-scorer" in message


def test_a_type_of_the_wrong_kind_says_what_it_is() -> None:
    with pytest.raises(ValidationError, match="'max-score-picker' is a picker, not a filter"):
        PolicyConfig.model_validate({"filters": [{"type": "max-score-picker"}]})


def test_bad_parameters_name_the_plugin_and_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        PolicyConfig.model_validate(
            {
                "scorers": [
                    {"name": "affinity", "type": "prefix-affinity-scorer", "parameters": {"x": 1}}
                ]
            }
        )
    message = str(info.value)
    assert "scorer 'affinity' (type 'prefix-affinity-scorer')" in message
    assert "x: Extra inputs are not permitted" in message
    with pytest.raises(ValidationError, match="capacity: Input should be greater than or equal"):
        PolicyConfig.model_validate(
            {"scorers": [{"type": "prefix-affinity-scorer", "parameters": {"capacity": 0}}]}
        )
    with pytest.raises(ValidationError, match="Extra inputs"):
        PolicyConfig.model_validate(
            {"picker": {"type": "max-score-picker", "parameters": {"a": 1}}}
        )


def test_parameters_accept_camel_case_and_names_default_to_the_type() -> None:
    config = PolicyConfig.model_validate(
        {
            "scorers": [
                {
                    "type": "prefix-affinity-scorer",
                    "weight": 2,
                    "parameters": {"endpointsPerBlock": 2},
                }
            ],
        }
    )
    assert config.scorers[0].name == "prefix-affinity-scorer"
    assert config.scorers[0].parameters == {"endpointsPerBlock": 2}
    spec = config.scorers[0]
    built = build_plugin("scorer", spec.name, spec.type, spec.parameters, PluginContext())
    assert getattr(built, "endpoints_per_block", None) == 2


def test_other_config_mistakes() -> None:
    with pytest.raises(ValidationError, match="used twice"):
        PolicyConfig.model_validate(
            {"scorers": [{"type": "queue-depth-scorer"}, {"type": "queue-depth-scorer"}]}
        )
    with pytest.raises(ValidationError, match="weight"):
        PolicyConfig.model_validate({"scorers": [{"type": "queue-depth-scorer", "weight": 0}]})
    with pytest.raises(ValidationError, match="Extra inputs"):
        PolicyConfig.model_validate({"scorer": []})


def test_build_plugin_raises_policy_config_error() -> None:
    with pytest.raises(PolicyConfigError, match="filter 'f': unknown type 'nope'"):
        build_plugin("filter", "f", "nope", {}, PluginContext())
    with pytest.raises(PolicyConfigError, match="bad parameters"):
        build_plugin("scorer", "s", "queue-depth-scorer", {"a": 1}, PluginContext())


def test_default_policy_is_valid_and_round_trips() -> None:
    config = default_policy()
    assert [s.type for s in config.filters] == [
        "model-filter",
        "tier-filter",
        "context-filter",
        "random-sample",
        "ejected-filter",
        "slo-filter",
    ]
    assert PolicyConfig.model_validate(config.model_dump()) == config


def test_register_rejects_bad_names_and_duplicates() -> None:
    with pytest.raises(ValueError, match="kebab-case"):
        register("NotKebab", NoParameters)
    with pytest.raises(ValueError, match="already registered"):

        @register("queue-depth-scorer", NoParameters)
        class Again(Scorer):
            def score(self, ctx, candidates, now_s):  # type: ignore[no-untyped-def]
                return []
