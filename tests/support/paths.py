"""Paths every test needs: the repository root (tests run from any working directory)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
