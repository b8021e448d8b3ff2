"""``benchmarks/check_problems_table.py``: the shards of a ``check-problems`` sweep merged
into one table. Covered: counts per subset, failures by category, an empty shard named, the
failed problems listed. Not covered: the sweep itself on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "check_problems_table.py"


def test_the_table_merges_the_shards(tmp_path: Path) -> None:
    a, b, empty = tmp_path / "check-0.json", tmp_path / "check-1.json", tmp_path / "check-2.json"
    a.write_text(json.dumps([{"subset": "L1", "name": "001_x", "status": "ok"},
                             {"subset": "L2", "name": "025_y", "status": "failed",
                              "category": "skipped", "reason": "needs 154.9 GB"}]))  # fmt: skip
    b.write_text(json.dumps([{"subset": "L1", "name": "002_z", "status": "ok"}]))
    empty.write_text("")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(a), str(b), str(empty)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"{empty}: empty" in out.stdout
    assert "| L1 | 2 | 2 | - |" in out.stdout and "| L2 | 1 | 0 | skipped 1 |" in out.stdout
    assert "2/3 problems ran their reference." in out.stdout
    assert "| L2 | 025_y | skipped | needs 154.9 GB |" in out.stdout
