"""Placeholder until the problems command lands (being written this session)."""

import typer


def problems_command() -> None:
    raise typer.Exit(2)
