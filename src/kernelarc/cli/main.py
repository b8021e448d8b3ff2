"""The ``kernelarc`` command line. Each command lives in its own module; heavy imports
(torch, the guard) happen inside the command functions, so ``kernelarc --help`` is fast."""

from __future__ import annotations

import typer

from kernelarc.cli import (
    agents_cmd,
    check_cmd,
    eval_cmd,
    optimize_cmd,
    problems_cmd,
    report_cmd,
    sol_cmd,
)

app = typer.Typer(
    name="kernelarc",
    help="KernelArc: verified, faster GPU kernels for SOL-ExecBench problems.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("eval")(eval_cmd.eval_command)
app.command("problems")(problems_cmd.problems_command)
app.command("sol")(sol_cmd.sol_command)
app.command("optimize")(optimize_cmd.optimize_command)
app.command("status")(optimize_cmd.status_command)
app.command("report")(report_cmd.report_command)
app.command("agents")(agents_cmd.agents_command)
app.command("check-problems")(check_cmd.check_problems_command)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
