"""The run directory a user gets:

```
RUN_DIR/
  config.json            the run's configuration (also in the store)
  store.sqlite           everything (candidates, evaluations, conclusions, incumbents, events)
  candidates/<id>/solution.json
  traces.jsonl           every trace of every evaluation, in order (official format)
  events.jsonl           the event log (a mirror of the store's events)
  best/solution.json     the final, fully validated solution (SOL-ExecBench format)
  best/traces.jsonl      its full-protocol traces, one per workload
  summary.json           what ``kernelarc status --json`` prints
  report.md              the result, the trajectory, the lessons (``kernelarc.report``;
  trajectory.png         written by the CLI when the run ends, and by ``kernelarc report``)
```
Files are written atomically (temp file + rename) or appended line by line, so a killed run
leaves no half-written JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kernelarc.problem.schema import Solution, Trace
from kernelarc.store.base import CandidateRecord


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    @property
    def store_path(self) -> Path:
        return self.path / "store.sqlite"

    @property
    def best_dir(self) -> Path:
        return self.path / "best"

    def write_config(self, config: dict[str, Any]) -> None:
        write_atomic(self.path / "config.json", json.dumps(config, indent=2) + "\n")

    def write_candidate(self, record: CandidateRecord) -> None:
        write_atomic(
            self.path / "candidates" / record.id / "solution.json",
            record.solution.model_dump_json(indent=2) + "\n",
        )

    def append_traces(self, traces: Iterable[Trace]) -> None:
        with open(self.path / "traces.jsonl", "a") as f:
            for t in traces:
                f.write(t.model_dump_json() + "\n")

    def append_event(self, kind: str, payload: dict[str, Any], at: str) -> None:
        with open(self.path / "events.jsonl", "a") as f:
            f.write(json.dumps({"at": at, "kind": kind, **payload}, default=str) + "\n")

    def write_best(self, solution: Solution, traces: list[Trace]) -> Path:
        path = self.best_dir / "solution.json"
        write_atomic(path, solution.model_dump_json(indent=2) + "\n")
        write_atomic(
            self.best_dir / "traces.jsonl", "".join(t.model_dump_json() + "\n" for t in traces)
        )
        return path

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")
