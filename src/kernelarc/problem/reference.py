"""Solutions built from a definition's own code: one-file PyTorch solutions, and the
reference itself as a solution (the baseline a run falls back to when nothing beats it).

Both are plain SOL-ExecBench solutions (``languages: ["pytorch"]``, not destination-passing,
one file ``solution.py``); nothing here judges them.
"""

from __future__ import annotations

from kernelarc.problem.schema import Definition, Solution

SOLUTION_FILE = "solution.py"


def make_solution(
    definition: Definition, *, agent: str, name: str, description: str, source: str, entry: str
) -> Solution:
    """A one-file, non destination-passing PyTorch solution of ``definition``."""
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition.name,
            "author": f"kernelarc:{agent}",
            "description": description,
            "spec": {
                "languages": ["pytorch"],
                "entry_point": f"{SOLUTION_FILE}::{entry}",
                "destination_passing_style": False,
            },
            "sources": [{"path": SOLUTION_FILE, "content": source}],
        }
    )


def reference_solution(definition: Definition, *, agent: str, description: str) -> Solution:
    """The problem's reference code, unchanged, as a solution (entry ``run``)."""
    return make_solution(
        definition,
        agent=agent,
        name=f"{definition.name}-reference",
        description=description,
        source=definition.reference,
        entry="run",
    )
