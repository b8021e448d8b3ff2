"""Placeholder until the eval command lands (being written this session)."""

import typer


def eval_command() -> None:
    raise typer.Exit(2)
