"""Fixtures shared by every test folder, and the ``gpu`` marker applied in one place.

A test marked ``@pytest.mark.gpu`` is skipped where torch sees no CUDA device, so the test
itself holds no such check. Helper functions live in ``_shared.py`` (``tests/`` is on
pytest's pythonpath).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelarc.examples import example_dir
from kernelarc.problem.loader import Problem, load_problem


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    import torch  # only when a gpu test was collected: conftest stays cheap otherwise

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in gpu:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def example() -> Path:
    """The bundled ``rmsnorm_h512`` example problem's directory."""
    return example_dir("rmsnorm_h512")


@pytest.fixture(scope="session")
def problem(example: Path) -> Problem:
    """The bundled ``rmsnorm_h512`` example problem, loaded (a folder may define its own)."""
    return load_problem(example)
