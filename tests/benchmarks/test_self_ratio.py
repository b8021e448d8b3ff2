"""``benchmarks/self_ratio.py``: its argument checks and its summary line (CPU, no guard).

The readings themselves need guard sessions (minutes): the script is run by hand
(benchmarks/README.md); what it reads is bounded by ``tests/guard/test_symmetric_timing.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _module() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import self_ratio
    finally:
        sys.path.remove(str(BENCH))
    return self_ratio


@pytest.mark.parametrize("bad", [["--guards", "0"], ["--workloads", "-1"], ["--guards", "x"]])
def test_counts_below_one_or_not_numbers_are_refused(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _module().parse_args(bad)
    assert exc.value.code == 2
    assert bad[0] in capsys.readouterr().err


def test_a_missing_problem_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _module().parse_args([str(tmp_path / "nope")])
    assert exc.value.code == 2
    assert "no such problem" in capsys.readouterr().err


def test_defaults_are_the_bundled_example_ten_guards_three_workloads() -> None:
    args = _module().parse_args([])
    assert (args.guards, args.workloads, args.device) == (10, 3, "cpu")
    assert (args.problem / "definition.json").is_file()


def test_summary_gives_median_min_max_and_count() -> None:
    sr = _module()
    assert sr.summary([]) == "no readings"
    assert sr.summary([1.0, 0.9, 1.2]) == "median 1.000  min 0.900  max 1.200  (3 readings)"
