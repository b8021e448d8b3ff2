"""The ``kernelarc`` command line. Each command lives in its own module and is registered
here through :func:`user_errors`: a :class:`~kernelarc.errors.KernelArcError` from any
command is printed as one ``error: ...`` line on stderr with exit code 2, never a traceback.

Importing this module must not import torch, so that ``kernelarc --help`` stays fast: the
package imports torch, triton and matplotlib only inside the functions that use them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.markup import escape

from kernelarc.cli import (
    agents_cmd,
    check_cmd,
    eval_cmd,
    optimize_cmd,
    problems_cmd,
    report_cmd,
    sol_cmd,
    status_cmd,
)
from kernelarc.cli.console import console
from kernelarc.errors import KernelArcError

USAGE_ERROR = 2
"""Exit code of bad usage and of any KernelArcError (typer's own usage errors use it too)."""

P = ParamSpec("P")
R = TypeVar("R")


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """``command`` with a KernelArcError printed as ``error: <message>`` on stderr and the
    process ending with :data:`USAGE_ERROR`; other exceptions pass through."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except KernelArcError as e:
            console(stderr=True).print(f"[red]error:[/] {escape(str(e))}")
            raise typer.Exit(USAGE_ERROR) from None

    return run


app = typer.Typer(
    name="kernelarc",
    help="KernelArc: verified, faster GPU kernels for SOL-ExecBench problems.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
COMMANDS: dict[str, Callable[..., None]] = {
    "eval": eval_cmd.eval_command,
    "problems": problems_cmd.problems_command,
    "sol": sol_cmd.sol_command,
    "optimize": optimize_cmd.optimize_command,
    "status": status_cmd.status_command,
    "report": report_cmd.report_command,
    "agents": agents_cmd.agents_command,
    "check-problems": check_cmd.check_problems_command,
}
for _name, _command in COMMANDS.items():
    app.command(_name)(user_errors(_command))


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
