"""Draw the router's import graph between its parts and print where it runs both ways:

    python -P tools/router_imports.py            # counts, mutual pairs, arrows inside cycles
    python -P tools/router_imports.py --arrows   # every arrow, with how many imports draw it

A part is a folder of router/ or a module at its top (`router/handler.py` is `handler`). An
arrow A -> B means some module of A imports some module of B (module-level, function-local and
`TYPE_CHECKING` imports alike: each is a dependency a reader must follow). An arrow is counted
as running back up when it lies on a cycle (both ends in one strongly connected component):
in a one-way graph there are none. import-linter's `acyclic_siblings` contract in
pyproject.toml holds the same rule; this prints the picture.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUTER = ROOT / "router"
PREFIX = "tiergate.router."


def part_of(path: Path) -> str:
    """The part of the router a file under router/ belongs to."""
    relative = path.relative_to(ROUTER)
    return relative.parts[0].removesuffix(".py")


def imported_modules(tree: ast.AST) -> Iterable[str]:
    """The absolute names every import statement in `tree` reaches (`from a import b` gives
    `a.b`, which is `a`'s part either way)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def arrows() -> Counter[tuple[str, str]]:
    """(importer part, imported part) -> how many import statements draw that arrow."""
    counted: Counter[tuple[str, str]] = Counter()
    for path in sorted(ROUTER.rglob("*.py")):
        source = part_of(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name in imported_modules(tree):
            if name.startswith(PREFIX):
                target = name.removeprefix(PREFIX).split(".")[0]
                if target != source:
                    counted[(source, target)] += 1
    return counted


def components(edges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Each node's strongly connected component (Tarjan), numbered."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    component: dict[str, int] = {}

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            number = len(set(component.values()))
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component[member] = number
                if member == node:
                    break

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return component


def report(counted: Mapping[tuple[str, str], int], show_arrows: bool) -> str:
    """The counts, the mutual pairs and the arrows on cycles, as text."""
    edges = set(counted)
    parts = {p for edge in edges for p in edge} | {part_of(p) for p in ROUTER.rglob("*.py")}
    parts.discard("__init__")
    mutual = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
    component = components(edges)
    on_cycles = sorted(e for e in edges if component[e[0]] == component[e[1]])
    lines = [
        f"parts: {len(parts)}",
        f"arrows: {len(edges)}",
        f"arrows on cycles: {len(on_cycles)}",
        f"mutual pairs: {len(mutual)}",
    ]
    lines += [f"  {a} <-> {b}" for a, b in mutual]
    if on_cycles:
        lines.append("arrows on cycles:")
        lines += [f"  {a} -> {b} ({counted[(a, b)]})" for a, b in on_cycles]
    if show_arrows:
        lines.append("arrows:")
        lines += [f"  {a} -> {b} ({n})" for (a, b), n in sorted(counted.items())]
    return "\n".join(lines)


def main() -> None:
    """Print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrows", action="store_true", help="list every arrow")
    print(report(arrows(), parser.parse_args().arrows))


if __name__ == "__main__":
    main()
