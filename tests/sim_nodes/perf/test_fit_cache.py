"""Fits kept on disk: read back bit for bit, refitted when an input or the code changes, and
never in the way when the folder or a file is unusable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tiergate.sim_nodes.catalogs import Catalog, default_catalog
from tiergate.sim_nodes.perf import fit_cache, fitting
from tiergate.sim_nodes.perf.calibration import Measurement, shipped_measurements


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "tiergate" / "fits"


@pytest.fixture
def fits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the groups actually fitted (not read from the cache), in order."""
    done: list[str] = []
    real = fitting._fit_group

    def counted(
        group: fitting.Group, mine: list[Measurement], catalog: Catalog, start: fitting.Values
    ) -> fitting.Values:
        done.append(group.name)
        return real(group, mine, catalog, start)

    monkeypatch.setattr(fitting, "_fit_group", counted)
    return done


def smallest_group() -> tuple[fitting.Group, list[Measurement]]:
    """The group with the fewest rows that still has a parameter to fit (a quick fit)."""
    catalog, rows = default_catalog(), shipped_measurements()
    candidates = []
    for g in fitting.groups(catalog):
        mine = [r for r in rows if r.accelerator in g.accelerators and r.active]
        if any(fitting.sees(p, r, catalog) for p in g.parameters for r in mine):
            candidates.append((len(mine), g.name, g, rows))
    _, _, group, rows = min(candidates)
    return group, rows


def test_a_kept_fit_is_read_back_bit_for_bit_and_not_fitted_again(
    cache: Path, fits: list[str]
) -> None:
    catalog = default_catalog()
    group, rows = smallest_group()
    start = fitting.current_values(catalog)
    first = fitting.fit_group(group, rows, catalog, start)
    again = fitting.fit_group(group, rows, catalog, start)
    assert fits == [group.name]
    assert again == first and again is not first
    assert any(first[p.name] != start[p.name] for p in group.parameters), "nothing was fitted"
    assert len(list(cache.glob("*.json"))) == 1


def test_a_changed_row_start_or_code_is_fitted_again(
    cache: Path, fits: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = default_catalog()
    group, rows = smallest_group()
    start = fitting.current_values(catalog)
    fitting.fit_group(group, rows, catalog, start)
    mine = next(i for i, r in enumerate(rows) if r.accelerator in group.accelerators)
    moved = list(rows)
    moved[mine] = dataclasses.replace(rows[mine], value=rows[mine].value * 1.5)
    fitting.fit_group(group, moved, catalog, start)
    name = group.parameters[0].name
    fitting.fit_group(group, rows, catalog, {**start, name: start[name] * 1.1})
    monkeypatch.setattr(fit_cache, "_code_digest", lambda: "another version of the model")
    fitting.fit_group(group, rows, catalog, start)
    assert fits == [group.name] * 4


def test_a_file_that_is_not_values_is_ignored_and_replaced(cache: Path, fits: list[str]) -> None:
    catalog = default_catalog()
    group, rows = smallest_group()
    start = fitting.current_values(catalog)
    first = fitting.fit_group(group, rows, catalog, start)
    (kept,) = cache.glob("*.json")
    for text in ("{not json", '{"a": "fast"}', '{"a": NaN}', "[1, 2]", '{"a": true}'):
        kept.write_text(text)
        assert fitting.fit_group(group, rows, catalog, start) == first
    assert fits == [group.name] * 6
    assert fit_cache.load(kept.stem) == first


def test_a_cache_folder_that_cannot_be_written_leaves_the_fit_uncached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fits: list[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # tiergate/fits cannot go under a file
    catalog = default_catalog()
    group, rows = smallest_group()
    start = fitting.current_values(catalog)
    first = fitting.fit_group(group, rows, catalog, start)
    assert fitting.fit_group(group, rows, catalog, start) == first
    assert fits == [group.name] * 2
    assert list(tmp_path.iterdir()) == [blocker]
