"""Test helpers shared by several test files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelarc import env


def shared_problems_root() -> Path:
    """The SOL-ExecBench problem tree beside the project (or $KERNELARC_PROBLEMS); the
    calling test is skipped when it is absent."""
    configured = env.shared_problems()
    root = configured or Path(__file__).resolve().parents[1] / ".." / "shared" / "problems"
    if not root.is_dir():
        pytest.skip(f"no shared problem tree at {root}")
    return root
