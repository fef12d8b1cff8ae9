"""broker.core is a tree: the pyproject contract ``acyclic_siblings_with_types`` (our contract type,
tests/architecture/import_contracts.py) holds for ``broker.core``, and it sees a cycle made only
of an import under ``if TYPE_CHECKING:``, which the built-in ``acyclic_siblings`` on import-linter's
graph of this repository (``exclude_type_checking_imports = true``) does not.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest
from importlinter import configuration
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract

from tests.architecture.import_contracts import AcyclicSiblingsWithTypesContract


@pytest.fixture(autouse=True)
def _linter_settings() -> None:
    configuration.configure()  # what the lint-imports command does first (its timer, its readers)


def contract(kind: type[AcyclicSiblingsContract], root: str, ancestor: str) -> AcyclicSiblingsContract:
    return kind(
        name="tree", session_options={"root_packages": [root]}, contract_options={"ancestors": [ancestor]}
    )


def test_broker_core_has_no_cycle_with_type_checking_imports() -> None:
    graph = grimp.build_graph("broker", exclude_type_checking_imports=True, cache_dir=None)
    check = contract(AcyclicSiblingsWithTypesContract, "broker", "broker.core").check(graph, verbose=False)
    assert check.kept, check.metadata["cycle_breakers_by_package"]


def test_a_cycle_through_a_type_checking_import_breaks_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "planted_core"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broker.py").write_text("from planted_core.client import Client\n")
    (package / "client.py").write_text(
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n"
        "    from planted_core.broker import Broker\n\n\n"
        "class Client:\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("planted_core", exclude_type_checking_imports=True, cache_dir=None)

    assert contract(AcyclicSiblingsContract, "planted_core", "planted_core").check(graph, verbose=False).kept
    check = contract(AcyclicSiblingsWithTypesContract, "planted_core", "planted_core").check(
        graph, verbose=False
    )
    assert not check.kept
    (breakers,) = check.metadata["cycle_breakers_by_package"]["planted_core"]
    assert set(breakers) == {"planted_core.broker", "planted_core.client"}
