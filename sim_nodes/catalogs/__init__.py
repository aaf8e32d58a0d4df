"""Hardware and model catalogs: data shipped as YAML, loaded into pydantic models."""

from .loader import CATALOG_ENV, Catalog, CatalogError, default_catalog, load_catalog
from .profiles import (
    DTYPE_BYTES,
    DTYPES,
    Accelerator,
    ChipLayout,
    Dtype,
    MemoryKind,
    ModelProfile,
)

__all__ = [
    "CATALOG_ENV",
    "DTYPES",
    "DTYPE_BYTES",
    "Accelerator",
    "Catalog",
    "ChipLayout",
    "CatalogError",
    "Dtype",
    "MemoryKind",
    "ModelProfile",
    "default_catalog",
    "load_catalog",
]
