"""The README's quick start is exactly two commands (docs/testing.md, the developers' guide): one
sets up and runs a broker on embedded defaults, one runs what CI runs. Static checks that keep
the text and the scripts in step; that the first command really works on a fresh clone is checked
by hand (docs/notes/house.md), the second is CI itself.
"""

from __future__ import annotations

import re
import tomllib

from tests.support.paths import REPO_ROOT

SETUP_AND_RUN = "bash scripts/setup.sh && .venv/bin/skipmq"
TEST = "bash scripts/test.sh"


def quick_start_commands(readme: str) -> list[str]:
    """The lines of the first code block under the README's ``## Quick start`` heading."""
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", readme, re.MULTILINE | re.DOTALL)
    assert section is not None, "the README has no '## Quick start' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), re.MULTILINE | re.DOTALL)
    assert block is not None, "the quick start has no code block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_quick_start_is_the_two_commands() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert quick_start_commands(readme) == [SETUP_AND_RUN, TEST]


def test_ci_runs_the_second_command() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == f"exec {TEST}", commands


def test_the_first_command_names_what_setup_installs() -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["skipmq"] == "broker.__main__:main"  # .venv/bin/skipmq, from pip install -e
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    assert "-m venv" in setup
    assert re.search(r"pip install -q (--[\w-]+ )*-e '\.\[dev,spark\]'", setup), "setup.sh's pip install"


def test_a_changed_quick_start_is_seen() -> None:
    readme = "## Quick start\n\ntext\n\n```\nbash scripts/setup.sh\n.venv/bin/skipmq\n```\n\n## Next\n"
    assert quick_start_commands(readme) == ["bash scripts/setup.sh", ".venv/bin/skipmq"]
