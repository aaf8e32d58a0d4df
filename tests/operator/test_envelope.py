"""The envelope of a pool with inline profiles: computed from the profiles, not the catalog's
entries, and saying where each profile came from."""

from __future__ import annotations

from typing import Any

import pytest

from tiergate.pools import InferencePoolSpec, predict
from tiergate.sim_nodes.catalogs import default_catalog

CATALOG = default_catalog()
BASE: dict[str, Any] = {
    "tier": "batched",
    "model": "llama-3.1-70b",
    "accelerator": "h100-sxm",
    "chips": 4,
    "batching": {"maxNumSeqs": 32},
}


def spec(**changes: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate({**BASE, **changes})


def wire(profile: Any, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = profile.model_copy(update=changes).model_dump(by_alias=True)
    return data


def test_a_renamed_copy_of_a_catalog_model_predicts_what_the_catalog_entry_does() -> None:
    catalog_spec = spec()
    inline_spec = spec(model="team-70b", modelProfile=wire(CATALOG.model("llama-3.1-70b"),
                                                           name="team-70b"))  # fmt: skip
    catalog_env = predict(catalog_spec, catalog_spec.workload, CATALOG).envelope()
    inline_env = predict(inline_spec, inline_spec.workload, CATALOG).envelope()
    assert (inline_env.model_source, inline_env.accelerator_source) == ("inline", "catalog")
    assert catalog_env.model_source == "catalog"
    numbers = ("tokens_per_second_per_stream", "cost_per_million_output_tokens_usd", "chips")
    for field in numbers:
        assert getattr(inline_env, field) == getattr(catalog_env, field), field


def test_a_shadowing_accelerator_profile_changes_the_price_and_says_so() -> None:
    published = spec()
    cheaper = spec(acceleratorProfile=wire(CATALOG.accelerator("h100-sxm"),
                                           price_per_chip_hour_usd=1.0))  # fmt: skip
    before = predict(published, published.workload, CATALOG).envelope()
    after = predict(cheaper, cheaper.workload, CATALOG).envelope()
    assert after.accelerator_source == "inline-shadows-catalog"
    ratio = after.cost_per_million_output_tokens_usd / before.cost_per_million_output_tokens_usd
    assert ratio == pytest.approx(1.0 / 2.99, rel=1e-3)
    assert after.tokens_per_second_per_stream == before.tokens_per_second_per_stream
    assert after.model_dump(by_alias=True)["acceleratorSource"] == "inline-shadows-catalog"
    assert CATALOG.accelerator("h100-sxm").price_per_chip_hour_usd == 2.99  # shared: untouched
