"""Loading the shipped catalogs plus any user catalog files.

User files (paths in the environment variable ``TIERGATE_CATALOG``, separated by ``:``, or
passed explicitly) use the same layout as the shipped YAML; an entry with an existing name
replaces the shipped profile.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from ..validation import first_problem, yaml_position
from .kinds import kind_problem
from .profiles import Accelerator, ModelProfile

CATALOG_ENV = "TIERGATE_CATALOG"


class CatalogError(ValueError):
    """A catalog file is unreadable or invalid, or a name is not in the catalog."""


class _CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    accelerators: list[Accelerator] = []
    models: list[ModelProfile] = []


class Catalog:
    """Accelerators and models by name. Treated as immutable once built: layering makes a
    new catalog (`with_profiles`), so one shared catalog can serve every pool."""

    def __init__(self, accelerators: Iterable[Accelerator], models: Iterable[ModelProfile]):
        self.accelerators: dict[str, Accelerator] = {a.name: a for a in accelerators}
        self.models: dict[str, ModelProfile] = {m.name: m for m in models}

    def with_profiles(
        self, *, model: ModelProfile | None = None, accelerator: Accelerator | None = None
    ) -> Catalog:
        """This catalog plus `model` and `accelerator` under their own names, as a new catalog.

        A profile named like an existing entry shadows it in the new catalog only; this one is
        left as it was. With neither profile given, this catalog itself.
        """
        if model is None and accelerator is None:
            return self
        return Catalog(
            [*self.accelerators.values(), *([accelerator] if accelerator else [])],
            [*self.models.values(), *([model] if model else [])],
        )

    def accelerator(self, name: str) -> Accelerator:
        try:
            return self.accelerators[name]
        except KeyError:
            raise CatalogError(
                f"unknown accelerator {name!r}; "
                f"choose one of: {', '.join(sorted(self.accelerators))}"
            ) from None

    def model(self, name: str) -> ModelProfile:
        try:
            return self.models[name]
        except KeyError:
            raise CatalogError(
                f"unknown model {name!r}; choose one of: {', '.join(sorted(self.models))}"
            ) from None


def _parse(text: str, origin: str) -> _CatalogFile:
    try:
        data = yaml.safe_load(text) or {}
        parsed = _CatalogFile.model_validate(data)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{origin}: not valid YAML{yaml_position(exc)}") from None
    except ValidationError as exc:
        raise CatalogError(f"{origin}: {first_problem(exc)}") from None
    for accelerator in parsed.accelerators:
        problem = kind_problem(accelerator)
        if problem:
            raise CatalogError(f"{origin}: {problem}")
    return parsed


def _shipped(filename: str) -> _CatalogFile:
    text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
    return _parse(text, filename)


def load_catalog(extra_files: Iterable[str | Path] = ()) -> Catalog:
    """The shipped catalogs, overlaid with `extra_files` (later files win)."""
    files = [_shipped("accelerators.yaml"), _shipped("models.yaml")]
    for path in extra_files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CatalogError(f"cannot read catalog file {path}: {exc.strerror}") from None
        files.append(_parse(text, str(path)))
    accelerators: dict[str, Accelerator] = {}
    models: dict[str, ModelProfile] = {}
    for f in files:
        accelerators.update({a.name: a for a in f.accelerators})
        models.update({m.name: m for m in f.models})
    return Catalog(accelerators.values(), models.values())


@functools.cache
def default_catalog() -> Catalog:
    """The catalog every command uses: shipped files plus ``$TIERGATE_CATALOG``."""
    extra = [p for p in os.environ.get(CATALOG_ENV, "").split(":") if p]
    return load_catalog(extra)
