"""Inline profiles: layered onto a copy of the catalog (never the shared one), named as the
spec, shadowing catalog entries of the same name, and used by every evaluation of the spec."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tiergate.sim_nodes.catalogs import Catalog, CatalogError
from tiergate.sim_nodes.perf import ServingSpec, build_deployment, layered_catalog, profile_sources


def model_profile(catalog: Catalog, name: str, **changes: Any) -> dict[str, Any]:
    """llama-3.1-70b's profile, renamed and changed, as camelCase wire data."""
    base = catalog.model("llama-3.1-70b").model_copy(update={"name": name, **changes})
    return base.model_dump(by_alias=True, exclude_none=True)


def accelerator_profile(catalog: Catalog, name: str, **changes: Any) -> dict[str, Any]:
    base = catalog.accelerator("h100-sxm").model_copy(update={"name": name, **changes})
    return base.model_dump(by_alias=True, exclude_none=True)


def test_with_profiles_adds_to_a_new_catalog_and_leaves_the_shared_one(catalog: Catalog) -> None:
    custom = catalog.model("llama-3.1-70b").model_copy(update={"name": "team-70b"})
    before = dict(catalog.models)
    layered = catalog.with_profiles(model=custom)
    assert layered is not catalog and layered.model("team-70b") is custom
    assert catalog.models == before and "team-70b" not in catalog.models
    assert layered.accelerators == catalog.accelerators
    assert catalog.with_profiles() is catalog  # nothing to add: nothing copied


def test_a_profile_named_like_a_catalog_entry_shadows_it_in_the_copy_only(
    catalog: Catalog,
) -> None:
    published = catalog.accelerator("h100-sxm")
    cheaper = published.model_copy(update={"price_per_chip_hour_usd": 1.0})
    layered = catalog.with_profiles(accelerator=cheaper)
    assert layered.accelerator("h100-sxm").price_per_chip_hour_usd == 1.0
    assert catalog.accelerator("h100-sxm") is published


def test_an_inline_profile_makes_an_unknown_name_valid(catalog: Catalog) -> None:
    plain = {"model": "team-70b", "accelerator": "h100-sxm", "chips": 4}
    with pytest.raises(CatalogError, match="unknown model 'team-70b'"):
        build_deployment(ServingSpec.model_validate(plain), catalog)
    spec = ServingSpec.model_validate({**plain, "modelProfile": model_profile(catalog, "team-70b")})
    deployment = build_deployment(spec, catalog)
    assert deployment.model.name == "team-70b" and deployment.chips == 4
    assert "team-70b" not in catalog.models
    assert profile_sources(spec, catalog) == ("inline", "catalog")


def test_an_inline_accelerator_is_simulated_and_reported_as_shadowing(catalog: Catalog) -> None:
    faster = accelerator_profile(catalog, "h100-sxm", memory_bandwidth_tb_per_s=6.7)
    base = {"model": "llama-3.1-8b", "accelerator": "h100-sxm", "chips": 1}
    spec = ServingSpec.model_validate({**base, "acceleratorProfile": faster})
    assert build_deployment(spec, catalog).accelerator.memory_bandwidth_tb_per_s == 6.7
    assert profile_sources(spec, catalog) == ("catalog", "inline-shadows-catalog")
    plain = ServingSpec.model_validate(base)
    assert build_deployment(plain, catalog).accelerator.memory_bandwidth_tb_per_s == 3.35
    assert profile_sources(plain, catalog) == ("catalog", "catalog")


def test_a_chips_auto_layout_is_sized_by_the_inline_profile(catalog: Catalog) -> None:
    """A 4x larger model on the same chips: `auto` picks more of them."""
    base = {"model": "llama-3.1-70b", "accelerator": "h100-sxm"}
    published = build_deployment(ServingSpec.model_validate(base), catalog)
    heavier = model_profile(catalog, "llama-3.1-70b", total_params_b=280, active_params_b=280)
    spec = ServingSpec.model_validate({**base, "modelProfile": heavier})
    assert build_deployment(spec, catalog).chips > published.chips


@pytest.mark.parametrize(
    ("field", "key", "make"),
    [("modelProfile", "model", model_profile), ("acceleratorProfile", "accelerator",
                                                 accelerator_profile)],
)  # fmt: skip
def test_a_profile_named_other_than_the_spec_is_refused(
    catalog: Catalog, field: str, key: str, make: Any
) -> None:
    spec = {"model": "llama-3.1-8b", "accelerator": "h100-sxm", field: make(catalog, "other")}
    with pytest.raises(ValidationError, match=f"{field}.name 'other' must equal {key}"):
        ServingSpec.model_validate(spec)


def test_profiles_take_camel_case_inline_and_snake_case_in_catalog_files(
    catalog: Catalog,
) -> None:
    wire = model_profile(catalog, "team-70b")
    assert "hiddenSize" in wire and "hidden_size" not in wire
    snake = catalog.model("llama-3.1-70b").model_dump()
    assert "hidden_size" in snake
    spec = ServingSpec.model_validate(
        {"model": "team-70b", "accelerator": "h100-sxm", "modelProfile": wire}
    )
    assert spec.model_profile is not None and spec.model_profile.hidden_size == 8192


def test_an_inline_profile_missing_a_field_names_it(catalog: Catalog) -> None:
    wire = model_profile(catalog, "team-70b")
    del wire["kvHeads"]
    with pytest.raises(ValidationError, match=r"modelProfile\.kvHeads\n\s+Field required"):
        ServingSpec.model_validate(
            {"model": "team-70b", "accelerator": "h100-sxm", "modelProfile": wire}
        )


def test_layered_catalog_is_the_base_when_the_spec_has_no_profiles(catalog: Catalog) -> None:
    spec = ServingSpec.model_validate({"model": "llama-3.1-8b", "accelerator": "h100-sxm"})
    assert layered_catalog(spec, catalog) is catalog
