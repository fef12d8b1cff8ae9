"""The pure cores are pure (sans-I/O, docs/overlay.md, docs/architecture.md): checked by parsing
overlay/**/*.py and broker/{mqtt,core,cluster,federation}/**/*.py (import-linter checks the imports too,
transitively: pyproject.toml [tool.importlinter]).

* no import of asyncio, socket, time, threading, selectors or subprocess anywhere in overlay/;
* no use of the global random generator (``random.random()``, ``random.choice(...)``, ... and
  ``from random import <function>``); only ``random.Random`` (a type / constructor) is allowed,
  and only overlay/sim may call ``random.Random(seed)``; no random call at module level;
* no module of overlay imports broker.

The broker's pure cores follow the same rules, except that they may import broker modules and may
build a ``random.Random`` (their constructors take a seeded one; a default is made when none is
given).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "overlay"
BROKER_CORES = [ROOT / "broker" / name for name in ("mqtt", "core", "cluster", "federation")]
BROKER_SOURCES = sorted(path for package in BROKER_CORES for path in package.rglob("*.py"))
FORBIDDEN_MODULES = {"asyncio", "socket", "time", "threading", "selectors", "subprocess"}
SOURCES = sorted(OVERLAY.rglob("*.py"))


def _imports(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def purity_violations(source: str, *, in_sim: bool, broker_core: bool = False) -> list[str]:
    tree = ast.parse(source)
    problems: list[str] = []
    for name in _imports(tree):
        root = name.split(".")[0]
        if root in FORBIDDEN_MODULES:
            problems.append(f"imports {name}")
        if root == "broker" and not broker_core:
            problems.append(f"imports {name} (overlay must not depend on broker)")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            for alias in node.names:
                if alias.name != "Random":
                    problems.append(f"from random import {alias.name} (global generator)")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
            and node.attr != "Random"
        ):
            problems.append(f"random.{node.attr} (global generator) at line {node.lineno}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "random"
            and node.func.attr == "Random"
            and not in_sim
            and not broker_core
        ):
            problems.append(f"random.Random(...) constructed outside overlay/sim at line {node.lineno}")
    module_level = [
        stmt
        for stmt in getattr(tree, "body", [])
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    for stmt in module_level:
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("random", "rng")
            ):
                problems.append(f"random call at module level, line {node.lineno}")
    return problems


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(OVERLAY)) for p in SOURCES])
def test_overlay_module_is_pure(path: Path) -> None:
    in_sim = "sim" in path.relative_to(OVERLAY).parts[:-1]
    assert purity_violations(path.read_text(), in_sim=in_sim) == []


@pytest.mark.parametrize("path", BROKER_SOURCES, ids=[str(p.relative_to(ROOT)) for p in BROKER_SOURCES])
def test_broker_core_module_is_pure(path: Path) -> None:
    assert purity_violations(path.read_text(), in_sim=False, broker_core=True) == []


def test_checker_catches_violations() -> None:
    assert purity_violations("import socket\n", in_sim=False, broker_core=True) == ["imports socket"]
    assert purity_violations("import random\nx = random.choice([1])\n", in_sim=False, broker_core=True)
    assert purity_violations("import time\n", in_sim=False) == ["imports time"]
    assert purity_violations("from asyncio import sleep\n", in_sim=False) == ["imports asyncio"]
    assert purity_violations("import broker.server\n", in_sim=False)
    assert purity_violations("import random\nx = random.random()\n", in_sim=False)
    assert purity_violations("import random\ndef f():\n    return random.choice([1])\n", in_sim=False)
    assert purity_violations("from random import shuffle\n", in_sim=False)
    assert purity_violations("import random\nr = random.Random(1)\n", in_sim=False)
    assert (
        purity_violations(
            "import random\ndef f() -> random.Random:\n    return random.Random(1)\n", in_sim=True
        )
        == []
    )
    assert (
        purity_violations(
            "import random\ndef f(rng: random.Random) -> int:\n    return rng.random()\n", in_sim=False
        )
        == []
    )


def test_overlay_sources_exist() -> None:
    names = {p.name for p in SOURCES}
    expected = {
        "node.py",
        "node_state.py",
        "node_base.py",
        "node_publish.py",
        "node_join.py",
        "node_maintenance.py",
        "frt.py",
        "table.py",
        "multicast.py",
        "skipgraph.py",
        "keys.py",
        "messages.py",
    }
    assert expected <= names
