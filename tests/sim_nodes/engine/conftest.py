import pytest

from tiergate.sim_nodes.catalogs import Catalog, default_catalog
from tiergate.sim_nodes.perf import Deployment, ServingSpec, build_deployment


@pytest.fixture
def catalog() -> Catalog:
    return default_catalog()


@pytest.fixture
def small_node(catalog: Catalog) -> Deployment:
    """llama-3.1-8b on one H100: steps of a few milliseconds."""
    return build_deployment(ServingSpec(model="llama-3.1-8b", accelerator="h100-sxm"), catalog)
