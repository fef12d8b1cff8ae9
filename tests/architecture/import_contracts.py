"""Import-linter contract types of SkipMQ's own (registered in pyproject.toml ``contract_types``).

import-linter builds one import graph per configuration file, and ours excludes the imports under
``if TYPE_CHECKING:`` (``exclude_type_checking_imports = true``: a type reference is not an import
a module runs). :class:`AcyclicSiblingsWithTypesContract` is the built-in ``acyclic_siblings``
contract checked against a graph that counts those imports too, for the packages whose modules
must form a tree even by their type references (``broker.core``: its ports and value types sit
below every part that names them). It builds that second graph itself, from the same root
packages, without a cache (the contract is cheap: grimp parses the root packages once more).
"""

from __future__ import annotations

import grimp
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.domain.contract import ContractCheck


class AcyclicSiblingsWithTypesContract(AcyclicSiblingsContract):
    """``acyclic_siblings`` with the imports under ``if TYPE_CHECKING:`` counted."""

    type_name = "acyclic_siblings_with_types"

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        root_packages = self.session_options["root_packages"]
        if isinstance(root_packages, str):
            root_packages = [root_packages]
        with_types = grimp.build_graph(
            *root_packages,
            include_external_packages=False,
            exclude_type_checking_imports=False,
            cache_dir=None,
        )
        return super().check(with_types, verbose)
