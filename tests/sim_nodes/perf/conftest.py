import pytest

from tiergate.sim_nodes.catalogs import Catalog, default_catalog


@pytest.fixture
def catalog() -> Catalog:
    return default_catalog()
