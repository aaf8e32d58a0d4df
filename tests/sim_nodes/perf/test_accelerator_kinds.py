"""An accelerator's kind and chip layout are catalog data: the fit's parameter groups, the error
report's families and the sizing of a deployment follow them, not the chip's name or memory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tiergate.sim_nodes.catalogs import Accelerator, Catalog, CatalogError, load_catalog
from tiergate.sim_nodes.catalogs.kinds import accelerator_kinds
from tiergate.sim_nodes.perf import chips_to_hold, default_tensor_parallel
from tiergate.sim_nodes.perf.calibration import FAMILIES, NO_KIND, family_of
from tiergate.sim_nodes.perf.deployment import Deployment
from tiergate.sim_nodes.perf.fitting import groups, priors

REPO = Path(__file__).resolve().parents[3]


def with_accelerator(catalog: Catalog, accelerator: Accelerator) -> Catalog:
    return catalog.with_profiles(accelerator=accelerator)


def test_the_groups_are_the_kinds_of_the_shipped_catalog(catalog: Catalog) -> None:
    by_kind = {g.name: g.accelerators for g in groups(catalog)}
    assert list(by_kind) == list(accelerator_kinds())
    for name, members in by_kind.items():
        assert members == tuple(n for n, a in catalog.accelerators.items() if a.kind == name)
    assert FAMILIES == ("dense GPU", "MoE GPU", "wafer single", "wafer multi", "LPU")


def test_a_new_chip_of_a_kind_shares_its_parameters(catalog: Catalog) -> None:
    """A GPU added as data joins the GPU kind's shared parameters; named after the kind."""
    new = catalog.accelerator("h100-sxm").model_copy(update={"name": "h100-nvl"})
    gpu = next(g for g in groups(with_accelerator(catalog, new)) if g.name == "gpu")
    shared = next(p for p in gpu.parameters if p.name == "gpu.compute_efficiency")
    assert "h100-nvl" in shared.accelerators


def test_a_chip_alone_in_its_kind_names_its_parameters_and_a_second_one_shares_them(
    catalog: Catalog,
) -> None:
    lpu = next(g for g in groups(catalog) if g.name == "lpu")
    assert [p.name for p in lpu.parameters] == ["groq-lpu.layer_latency_us"]
    assert priors(lpu) == {"groq-lpu.layer_latency_us": 40.0}
    second = catalog.accelerator("groq-lpu").model_copy(update={"name": "lpu-2"})
    lpu = next(g for g in groups(with_accelerator(catalog, second)) if g.name == "lpu")
    assert [(p.name, p.accelerators) for p in lpu.parameters] == [
        ("lpu.layer_latency_us", ("groq-lpu", "lpu-2"))
    ]


def test_fitted_alone_splits_a_field_off_for_one_chip(catalog: Catalog) -> None:
    gpu = next(g for g in groups(catalog) if g.name == "gpu")
    grouped = [p for p in gpu.parameters if p.field == "grouped_gemm_efficiency"]
    assert [(p.name, "b200" in p.accelerators) for p in grouped] == [
        ("gpu.grouped_gemm_efficiency", False),
        ("b200.grouped_gemm_efficiency", True),
    ]
    fp4 = next(p for p in gpu.parameters if p.field == "fp4_compute_efficiency")
    assert fp4.accelerators == tuple(
        n for n in gpu.accelerators if "fp4" in catalog.accelerators[n].peak_tflops
    )


def test_a_chip_of_no_kind_is_fitted_in_no_group_and_reported_apart(catalog: Catalog) -> None:
    loose = catalog.accelerator("h100-sxm").model_copy(update={"name": "mine", "kind": None})
    mixed = with_accelerator(catalog, loose)
    assert all("mine" not in g.accelerators for g in groups(mixed))
    deployment = Deployment(catalog.model("llama-3.1-8b"), loose)
    assert family_of(None, deployment) == NO_KIND  # type: ignore[arg-type]


def test_the_family_follows_the_kind_not_the_name(catalog: Catalog) -> None:
    wafer_named_otherwise = catalog.accelerator("wse-3").model_copy(update={"name": "big-chip"})
    model = catalog.model("llama-3.1-8b")
    one = Deployment(model, wafer_named_otherwise, 1)
    assert family_of(None, one) == "wafer single"  # type: ignore[arg-type]
    as_lpu = wafer_named_otherwise.model_copy(update={"kind": "lpu"})
    assert family_of(None, Deployment(model, as_lpu, 1)) == "LPU"  # type: ignore[arg-type]


def test_sizing_follows_the_chip_layout_not_the_memory(catalog: Catalog) -> None:
    """The LPU laid out in tensor-parallel groups is sized like a GPU: powers of two within a
    system, then whole systems."""
    model = catalog.model("llama-3.2-1b")  # 16 layers, 2.5 GB in bf16: a dozen LPUs
    lpu = catalog.accelerator("groq-lpu")
    assert lpu.memory_kind == "sram" and lpu.layout == "pipeline"
    grouped = lpu.model_copy(update={"chip_layout": "tensor-parallel"})
    assert chips_to_hold(model, lpu) == 12  # one chip at a time
    assert chips_to_hold(model, grouped) == 16  # two systems of 8
    assert default_tensor_parallel(16, model, lpu) == 1  # 16 chips <= 16 layers: a pipeline
    assert default_tensor_parallel(16, model, grouped) == 8  # a system's group
    wafer_as_gpu = catalog.accelerator("h100-sxm").model_copy(update={"memory_kind": "sram"})
    assert wafer_as_gpu.layout == "tensor-parallel"  # the catalog's layout wins
    assert chips_to_hold(model, wafer_as_gpu) == 1


@pytest.mark.parametrize(("memory", "layout"), [("sram", "pipeline"), ("hbm", "tensor-parallel")])
def test_an_inline_profile_without_a_layout_gets_its_memory_s(
    catalog: Catalog, memory: str, layout: str
) -> None:
    data = catalog.accelerator("h100-sxm").model_dump(exclude={"chip_layout", "kind"})
    profile = Accelerator.model_validate({**data, "memory_kind": memory})
    assert profile.chip_layout is None and profile.layout == layout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("kind: tpu", "unknown kind 'tpu'; choose one of: gpu, wafer, lpu"),
        ("kind: lpu\n    fitted_alone: [compute_efficiency]", "is not fitted for kind lpu"),
        ("fitted_alone: [compute_efficiency]", "fitted_alone needs a kind"),
    ],
)
def test_a_bad_kind_in_a_catalog_file_names_the_problem(
    catalog: Catalog, tmp_path: Path, extra: str, message: str
) -> None:
    fields = catalog.accelerator("h100-sxm").model_dump(exclude={"kind", "fitted_alone"})
    lines = "\n".join(f"    {k}: {v}" for k, v in fields.items() if k != "name" and v is not None)
    f = tmp_path / "mine.yaml"
    f.write_text(f"accelerators:\n  - name: mine\n    {extra}\n{lines}\n")
    with pytest.raises(CatalogError, match=message):
        load_catalog([f])


def test_no_module_of_the_product_names_a_shipped_accelerator(catalog: Catalog) -> None:
    """Code branches on catalog data, never on a chip's name: a string constant of a module
    in sim_nodes, router, operator or tiergate is no accelerator's name."""
    names = set(catalog.accelerators)
    named = {}
    for folder in ("sim_nodes", "router", "operator", "tiergate"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found = [
                f"{node.lineno}: {node.value!r}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and node.value in names
            ]
            if found:
                named[str(path.relative_to(REPO))] = found
    assert named == {}
