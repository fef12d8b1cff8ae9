"""The layout rules of docs/architecture.md that import-linter's contracts (pyproject.toml) do not
cover: no import cycles between modules, and no module over 600 lines without a reason.

* Cycles: every import executed at run time counts (imports under ``TYPE_CHECKING`` do not: they
  are type references, e.g. ``overlay.frt`` naming ``overlay.table.RoutingTable``).
* Size: a module of broker/, overlay/, simulation/, tools/, pipeline/ or bench/ longer than 600
  lines must say why in a line of its module docstring starting with "Size:".
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

from tests.support.paths import REPO_ROOT

PACKAGES = ("broker", "overlay", "simulation", "tools", "pipeline", "bench")
MAX_LINES = 600


def import_cycles(package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str) -> None:
    assert import_cycles(package) == []


def oversized_without_reason(root: Path) -> list[str]:
    problems = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "_pb" in path.parts:
                continue  # generated code
            text = path.read_text()
            lines = text.count("\n") + 1
            if lines <= MAX_LINES:
                continue
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if not any(line.strip().startswith("Size:") for line in docstring.splitlines()):
                problems.append(f"{path.relative_to(root)}: {lines} lines and no 'Size:' reason")
    return problems


def test_every_module_over_600_lines_says_why() -> None:
    assert oversized_without_reason(REPO_ROOT) == []


def test_the_size_check_finds_an_oversized_module(tmp_path: Path) -> None:
    package = tmp_path / "tools"
    package.mkdir()
    (package / "big.py").write_text('"""A big module."""\n' + "x = 1\n" * 700)
    (package / "big_ok.py").write_text('"""A big module.\n\nSize: one table.\n"""\n' + "x = 1\n" * 700)
    assert oversized_without_reason(tmp_path) == ["tools/big.py: 702 lines and no 'Size:' reason"]
