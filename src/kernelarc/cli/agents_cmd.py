"""``kernelarc agents``: the built-in agents, one line each."""

from __future__ import annotations

from rich.table import Table

from kernelarc.cli.console import console
from kernelarc.proposers.registry import describe


def agents_command() -> None:
    """List the agents `kernelarc optimize --agents` accepts."""
    table = Table(show_header=True)
    table.add_column("agent")
    table.add_column("what it does")
    for name, text in describe():
        table.add_row(name, text)
    console().print(table)
