"""How `make e2e` hands the tests to its processes: test by test, except the modules whose
tests share a fixture wider than one test (one release for the module), which go whole.

Every other e2e test installs a release of its own in a namespace of its own, so any process can
run it. Handing them out one by one lets the processes finish together instead of one running
a six-test module alone at the end (`--dist loadscope` hands out whole modules).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

REPO = Path(__file__).resolve().parents[2]


class TestsOrWholeModules(LoadScopeScheduling):
    """`--dist loadscope`, with a test's own node id as its scope unless its module shares a
    fixture between tests."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if shares_fixtures(REPO / module) else nodeid


@cache
def shares_fixtures(module: Path) -> bool:
    """Whether `module` defines a fixture whose scope is wider than one test."""
    tree = ast.parse(module.read_text(), str(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_fixture(node.func):
            for keyword in node.keywords:
                if keyword.arg == "scope" and not (
                    isinstance(keyword.value, ast.Constant) and keyword.value.value == "function"
                ):
                    return True
    return False


def _is_fixture(func: ast.expr) -> bool:
    """`pytest.fixture` or a bare `fixture`."""
    if isinstance(func, ast.Attribute):
        return func.attr == "fixture"
    return isinstance(func, ast.Name) and func.id == "fixture"


def scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """For `pytest_xdist_make_scheduler`: ours with `--dist loadscope`, else xdist's own."""
    if config.getoption("dist", None) != "loadscope":
        return None
    return TestsOrWholeModules(config, log)
