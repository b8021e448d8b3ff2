"""Placeholder until the sol command lands (being written this session)."""

import typer


def sol_command() -> None:
    raise typer.Exit(2)
