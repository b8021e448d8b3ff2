"""Test helpers shared by several test files."""

from __future__ import annotations

import json
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


def write_solution(folder: Path, source: str, name: str) -> Path:
    """A solution.json for the bundled rmsnorm_h512 example whose one source file ``s.py``
    lies beside it (no inline content: the loader reads the file)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.py").write_text(source)
    sol = {
        "name": name,
        "definition": "ka_rmsnorm_h512",
        "author": "kernelarc-tests",
        "spec": {
            "languages": ["pytorch"],
            "entry_point": "s.py::run",
            "destination_passing_style": True,
        },
        "sources": [{"path": "s.py"}],
    }
    path = folder / "solution.json"
    path.write_text(json.dumps(sol, indent=2))
    return path
