"""``kernelarc optimize``: run a search, or continue one with ``--resume``.

Every option is checked before the run directory is created, so a rejected command leaves
nothing behind. A resumed run keeps its own configuration: an option given again must have
the run's value (a different one is refused, naming it), and a finished run is not judged
again: its status is printed.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from kernelarc.cli.console import console
from kernelarc.cli.status_cmd import print_status
from kernelarc.env import prog
from kernelarc.errors import KernelArcError
from kernelarc.guard.config import GuardConfig, resolve_device
from kernelarc.guard.evaluator import Guard
from kernelarc.guard.footprint import device_warnings
from kernelarc.orchestration.config import RunConfig, StageConfig
from kernelarc.orchestration.finish import run_status
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.schema import Solution
from kernelarc.proposers.registry import DEFAULT_AGENTS, make_agents
from kernelarc.proposers.seed import SeedAgent
from kernelarc.report import write_report
from kernelarc.roofline.bounds import workload_bounds
from kernelarc.store.sqlite import SQLiteStore

SEED_AGENT = "seed"
"""The name of the agent ``--seed-solution`` adds (recorded in the run's agents)."""

_SHOWN = {
    "evaluated",
    "reference_broken",
    "incumbent",
    "draft",
    "draft_requested",
    "duplicate",
    "composition",
    "composition_skipped",
    "compose_skipped",
    "fallback",
    "fallback_skipped",
    "confirmation",
    "confirmation_skipped",
    "best",
    "agent_retired",
    "propose_error",
    "resumed",
    "search_stopped",
    "full_protocol_too_slow",
    "no_solution",
    "interrupted",
}


FIXED_ON_RESUME: dict[str, str] = {
    "agents": "agents",
    "budget": "budget",
    "budget_per_agent": "budget_per_agent",
    "time_limit": "time_limit_s",
    "device": "device",
    "seed": "seed",
    "no_memory": "memory",
    "no_board": "board",
    "no_drafting": "drafting",
    "independent": "independent",
    "patience": "patience",
    "memory": "memory_file",
    "timeout": "timeout_s",
    "compile_workers": "compile_workers",
    "cupti": "cupti",
    "full_iterations": "full",
    "full_warmup": "full",
    "no_reference_fallback": "reference_fallback",
    "no_confirm": "confirm",
}
"""Options (parameter name -> RunConfig field) a resumed run takes from its store: given
again, they must have the run's value."""

_FIELD_OPTIONS = {field: param for param, field in FIXED_ON_RESUME.items() if field != "full"}
_FIELD_OPTIONS |= {"full.iterations": "full_iterations", "full.warmup": "full_warmup"}
_FIELD_OPTIONS |= {"iterations": "full_iterations", "warmup": "full_warmup"}  # StageConfig
_BOUNDS = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}


def _option_errors(error: ValidationError) -> str:
    """One line naming each rejected option, its allowed range and the value given."""
    parts = []
    for e in error.errors():
        if not e["loc"]:  # a rule across options, e.g. a repeated agent name
            parts.append(str(e["msg"]).removeprefix("Value error, "))
            continue
        field = ".".join(str(p) for p in e["loc"])
        param = _FIELD_OPTIONS.get(field, field)
        bound = next(
            (f"{_BOUNDS[k]} {v}" for k, v in (e.get("ctx") or {}).items() if k in _BOUNDS), None
        )
        if param == "agents" and e["type"] == "too_short":
            rule = "name at least one agent"
        elif param == "cupti":
            rule = "be auto, on or off"
        else:
            rule = f"be {bound}" if bound else e["msg"].lower()
        parts.append(f"--{param.replace('_', '-')} must {rule} (got {e.get('input')!r})")
    return "; ".join(parts)


FINISHED_REASONS = ("budget spent", "every agent is done")
"""Why a search stopped for good: resuming it would find nothing left to judge."""


def optimize_command(
    ctx: typer.Context,
    problem_dir: Annotated[Path, typer.Argument(help="problem directory")],
    agents: Annotated[
        str, typer.Option(help="comma-separated agent names (see `kernelarc agents`)")
    ] = ",".join(DEFAULT_AGENTS),
    budget: Annotated[int, typer.Option(help="candidates judged in all")] = 16,
    budget_per_agent: Annotated[int | None, typer.Option(help="cap per agent")] = None,
    time_limit: Annotated[
        float | None, typer.Option(help="seconds for the search and the final composition")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda[:N]")] = "auto",
    seed: Annotated[int, typer.Option(help="base seed")] = 200,
    run_dir: Annotated[
        Path | None, typer.Option(help="run directory (default: runs/<problem>-<time>)")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue the run in --run-dir")] = False,
    no_memory: Annotated[
        bool, typer.Option("--no-memory", help="ablation: no shared conclusions")
    ] = False,
    no_board: Annotated[
        bool, typer.Option("--no-board", help="ablation: agents do not see each other's incumbents")
    ] = False,
    no_drafting: Annotated[
        bool, typer.Option("--no-drafting", help="ablation: no plateau-triggered drafts")
    ] = False,
    independent: Annotated[
        bool, typer.Option("--independent", help="best-of-N: no sharing of any kind")
    ] = False,
    patience: Annotated[int, typer.Option(help="evaluations without gain before a draft")] = 3,
    memory: Annotated[
        Path | None,
        typer.Option("--memory", help="cross-run memory file (read at start, written at the end)"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="guard seconds per workload")] = 300.0,
    compile_workers: Annotated[
        int,
        typer.Option(
            help="compile torch.compile candidates with this many Inductor workers in a "
            "pass before judging (needs a PID namespace; 0: one thread, in the first calls)",
        ),
    ] = 0,
    cupti: Annotated[
        str,
        typer.Option(
            help="the guard's timer: auto (CUPTI kernel spans when available), on, or off "
            "(CUDA events; much cheaper on calls that launch thousands of kernels)"
        ),
    ] = "auto",
    full_iterations: Annotated[int, typer.Option(help="timed calls, full protocol")] = 50,
    full_warmup: Annotated[int, typer.Option(help="warm-up calls, full protocol")] = 10,
    json_out: Annotated[
        bool, typer.Option("--json", help="print the final status as JSON")
    ] = False,
    no_reference_fallback: Annotated[
        bool,
        typer.Option(
            "--no-reference-fallback",
            help="hand over the best candidate even when none is significantly faster than the "
            "reference",
        ),
    ] = False,
    no_confirm: Annotated[
        bool,
        typer.Option(
            "--no-confirm",
            help="hand over the best candidate as the search measured it, without judging it "
            "again in a new process with empty JIT caches",
        ),
    ] = False,
    workloads: Annotated[
        list[str] | None,
        typer.Option(
            "--workloads",
            "-w",
            help="judge only these workloads: uuid, uuid prefix or index; repeatable or "
            "comma-separated; '!X' leaves X out (of all workloads when only left-out ones "
            "are given); the solution is then verified on the chosen ones only",
        ),
    ] = None,
    seed_solution: Annotated[
        list[Path] | None,
        typer.Option(
            "--seed-solution",
            help="a solution.json to judge as a candidate of its own (repeatable); "
            "the tuner refines Triton seeds",
        ),
    ] = None,
) -> None:
    """Search for a faster, verified solution of PROBLEM_DIR with several agents under a
    fixed candidate budget. Writes the run directory (store, traces, best/solution.json)."""
    err = console(stderr=True)
    given = {  # by the source's name: typer ships its own copy of click's enum
        name
        for name in ctx.params
        if getattr(ctx.get_parameter_source(name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")
    }
    summary = _optimize(
        problem_dir,
        agents,
        budget,
        budget_per_agent,
        time_limit,
        device,
        seed,
        run_dir,
        resume,
        no_memory,
        no_board,
        no_drafting,
        independent,
        patience,
        memory,
        timeout,
        full_iterations,
        full_warmup,
        err,
        seed_solutions=seed_solution or [],
        reference_fallback=not no_reference_fallback,
        compile_workers=compile_workers,
        confirm=not no_confirm,
        workloads=workloads or [],
        cupti=cupti,
        given=given,
    )
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_status(summary, console())
    raise typer.Exit(0 if summary.get("best") else 1)


def _optimize(
    problem_dir: Path,
    agent_names: str,
    budget: int,
    budget_per_agent: int | None,
    time_limit: float | None,
    device: str,
    seed: int,
    run_dir: Path | None,
    resume: bool,
    no_memory: bool,
    no_board: bool,
    no_drafting: bool,
    independent: bool,
    patience: int,
    memory: Path | None,
    timeout: float,
    full_iterations: int,
    full_warmup: int,
    err: Console,
    seed_solutions: list[Path] | None = None,
    reference_fallback: bool = True,
    compile_workers: int = 0,
    confirm: bool = True,
    workloads: list[str] | None = None,
    cupti: str = "auto",
    given: set[str] | None = None,
) -> dict[str, Any]:
    problem = load_problem(problem_dir)
    chosen = [w.uuid for w in problem.select(workloads)] if workloads else None
    seeds = _load_seeds(seed_solutions or [], problem.definition.name)
    if run_dir is None:
        if resume:
            raise KernelArcError("--resume needs --run-dir DIR (the run to continue)")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path("runs") / f"{problem.definition.name}-{stamp}"
    store_path = run_dir / "store.sqlite"
    if store_path.exists() and not resume:
        raise KernelArcError(
            f"{run_dir} already holds a run: add --resume to continue it, "
            "or choose another --run-dir"
        )
    if resume and not store_path.exists():
        raise KernelArcError(f"--resume: {run_dir} holds no run (no store.sqlite)")
    try:
        config = RunConfig(
            problem=str(problem_dir),
            definition=problem.definition.name,
            agents=[a.strip() for a in agent_names.split(",") if a.strip()],
            budget=budget,
            budget_per_agent=budget_per_agent,
            time_limit_s=time_limit,
            device=device,
            seed=seed,
            timeout_s=timeout,
            compile_workers=compile_workers,
            cupti=cupti,
            memory=not no_memory,
            board=not no_board,
            drafting=not no_drafting,
            independent=independent,
            patience=patience,
            memory_file=str(memory) if memory else None,
            full=StageConfig(rounds=10, warmup=full_warmup, iterations=full_iterations),
            reference_fallback=reference_fallback,
            confirm=confirm,
            workloads=chosen,
        )
    except ValidationError as e:
        raise KernelArcError(_option_errors(e)) from None
    if not resume:  # checked before the run directory exists: a refusal leaves nothing
        _seed_config(config, bool(seeds), resume)
        make_agents([n for n in config.agents if n != SEED_AGENT])
        resolve_device(config.device)
    run_dir.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(store_path)
    try:
        if resume:  # a resumed run keeps its own configuration
            asked = config
            config = RunConfig.model_validate(store.open_run(config.model_dump(mode="json")))
            if config.definition != asked.definition:
                raise KernelArcError(
                    f"{run_dir} holds a run of {config.definition!r}, not "
                    f"{asked.definition!r}: use another --run-dir"
                )
            _refuse_changes(asked, config, given or set())
            if chosen is not None and chosen != config.workloads:
                err.print(
                    "[yellow]--workloads is not this run's: a resumed run judges the workloads "
                    "it started with[/]"
                )
            _seed_config(config, bool(seeds), resume)  # the same seed files, or a refusal
            finished = _finished(store)
            if finished is not None:
                err.print(
                    f"{escape(str(run_dir))} is finished ({finished}): nothing is judged "
                    "again; its status follows"
                )
                return run_status(store, run_dir)
            err.print(
                f"resuming {run_dir} (budget {config.budget}, agents {','.join(config.agents)})"
            )
        config = _seed_config(config, bool(seeds), resume)
        problem = _narrowed(problem, config.workloads, err)
        agents = make_agents([n for n in config.agents if n != SEED_AGENT])
        if seeds:
            agents.append(SeedAgent(seeds, name=SEED_AGENT))
        gcfg = GuardConfig(
            device=config.device,
            timeout=config.timeout_s,
            seed=config.seed,
            compile_workers=config.compile_workers,
            cupti=config.cupti,
        )
        with Guard(problem, gcfg) as guard:
            bounds, warnings = workload_bounds(problem.definition, problem.workloads, guard.device)
            for w in warnings[:5]:
                err.print(f"[yellow]{escape(w)}[/]")
            for w in device_warnings(problem.definition, problem.workloads, guard.device):
                err.print(f"[yellow]{escape(w)}[/]")
            err.print(
                f"optimizing {problem.definition.name} on {guard.device} with "
                f"{', '.join(a.name for a in agents)}; budget {config.budget}; run dir "
                f"{run_dir}"
            )
            orch = Orchestrator(
                problem,
                agents,
                config,
                RunDir(run_dir),
                store,
                guard,
                bounds,
                on_event=Progress(err),
            )
            summary = orch.run()
    finally:
        store.close()
    _report(run_dir, err)
    return summary


def _report(run_dir: Path, err: Console) -> None:
    """Write the run's report; a failure is said, and the run's own result stands."""

    try:
        written = write_report(run_dir)
    except Exception as e:  # the run is recorded; only its report is missing
        err.print(
            f"[red]report not written[/] ({type(e).__name__}: {escape(str(e))}); "
            f"try `{escape(prog())} report {escape(str(run_dir))}`"
        )
        return
    err.print(f"report: {escape(str(written.report))}")
    if written.note:
        err.print(f"[yellow]{escape(written.note)}[/]")


def _refuse_changes(asked: RunConfig, run: RunConfig, given: set[str]) -> None:
    """A KernelArcError naming every option of :data:`FIXED_ON_RESUME` given on the command
    line with a value other than the resumed run's (``asked``: the command line's)."""
    changed = []
    for param, field in FIXED_ON_RESUME.items():
        if param not in given:
            continue
        mine, theirs = getattr(asked, field), getattr(run, field)
        if field == "agents":
            theirs = [n for n in theirs if n != SEED_AGENT]
        if mine != theirs:
            shown = ",".join(theirs) if field == "agents" else theirs
            if field == "full":
                shown = getattr(run.full, param.removeprefix("full_"))
            changed.append(f"--{param.replace('_', '-')} (this run's: {shown})")
    if changed:
        raise KernelArcError(
            f"--resume continues a run with its own options; {', '.join(changed)} cannot "
            "change: drop the option, or start a new run with another --run-dir"
        )


def _finished(store: SQLiteStore) -> str | None:
    """Why the run in ``store`` is over (its search stopped for good and its end handed
    over a result without a stop signal cutting it), or None when resuming it has
    something left to do."""
    stops = store.events("search_stopped")
    if not stops or stops[-1].payload.get("reason") not in FINISHED_REASONS:
        return None
    after = stops[-1].seq
    if any(e.seq > after for e in store.events("interrupted")):
        return None  # its end was cut short (not composed or confirmed): resuming ends it
    ends = [e for kind in ("best", "no_solution") for e in store.events(kind)]
    if not any(e.seq > after for e in ends):
        return None
    return str(stops[-1].payload["reason"])


def _narrowed(problem: Problem, uuids: list[str] | None, err: Console) -> Problem:
    """``problem`` with only the run's workloads (``RunConfig.workloads``), in the problem's
    order; a uuid the problem no longer has is an error (the workload file changed)."""
    if uuids is None:
        return problem
    known = {w.uuid for w in problem.workloads}
    missing = [u for u in uuids if u not in known]
    if missing:
        raise KernelArcError(
            f"the run judges workloads {missing[:3]} that {problem.root} no longer has: "
            "resume it with the same workload file, or start a new run"
        )
    kept = tuple(w for w in problem.workloads if w.uuid in set(uuids))
    err.print(
        f"[yellow]judging {len(kept)} of the problem's {len(problem.workloads)} workloads "
        "(--workloads): the solution is verified on these only[/]"
    )
    return dataclasses.replace(problem, workloads=kept)


def _seed_config(config: RunConfig, seeded: bool, resume: bool) -> RunConfig:
    """``config`` with the seed agent recorded in its agents (so that ``status`` lists it
    and a resumed run counts its candidates); refuses mixing seeded and unseeded runs."""
    listed = SEED_AGENT in config.agents
    if not resume:
        if listed:
            raise KernelArcError(
                f"{SEED_AGENT!r} is not an --agents name: give seed files with --seed-solution"
            )
        if not seeded:
            return config
        data = config.model_dump(mode="json")
        return RunConfig.model_validate({**data, "agents": [*config.agents, SEED_AGENT]})
    if listed and not seeded:
        raise KernelArcError(
            "this run was started with --seed-solution: resume it with the same files"
        )
    if seeded and not listed:
        raise KernelArcError(
            "this run was started without --seed-solution: seeds cannot be added on resume"
        )
    return config


def _load_seeds(paths: list[Path], definition: str) -> list[Solution]:
    """The ``--seed-solution`` files as Solutions; a file that does not load or is for
    another definition is a KernelArcError naming it."""
    seeds = []
    for path in paths:
        try:
            sol = load_solution(path)
        except KernelArcError as e:
            raise KernelArcError(f"--seed-solution {path} does not load: {e}") from None
        if sol.definition != definition:
            raise KernelArcError(
                f"--seed-solution {path}: its definition is {sol.definition!r}, "
                f"not this problem's {definition!r}"
            )
        seeds.append(sol)
    return seeds


def _fmt(value: Any) -> str:
    """``value`` for a progress line: floats rounded, lists and mappings inline and short."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{k}={_fmt(v)}" for k, v in list(value.items())[:4])
            + (", ...}" if len(value) > 4 else "}")
        )
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v) for v in value[:4]) + (", ..." if len(value) > 4 else "")
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _speed(score: Any) -> str:
    return f"{score:.2f}×" if isinstance(score, int | float) else "-"


class Progress:
    """The search's events as short lines for people, on ``err``: what each candidate did
    and whose incumbent it became; other shown events as ``kind: key=value, ...``."""

    def __init__(self, err: Console) -> None:
        self.err = err
        self.best: float | None = None
        """The best figure of any incumbent so far (the run's best overall)."""

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        if kind not in _SHOWN:
            return
        if kind == "evaluated":
            self.err.print(escape(self._evaluated(payload)))
        elif kind == "incumbent":
            self._incumbent(payload)
        elif kind == "no_solution" and payload.get("common_failure"):  # in full: what to fix
            self.err.print(escape(f"no_solution: {payload.get('why')}"), style="yellow")
            self.err.print(escape(str(payload["common_failure"])), style="yellow")
        else:
            text = ", ".join(f"{k}={_fmt(v)}" for k, v in payload.items())
            self.err.print(escape(f"{kind}: {text}" if text else kind), style="dim")

    def _incumbent(self, payload: dict[str, Any]) -> None:
        score = payload.get("score")
        if isinstance(score, int | float):
            self.best = score if self.best is None else max(self.best, score)
        best = f" (best overall {_speed(self.best)})" if self.best is not None else ""
        self.err.print(
            escape(f"new incumbent of {payload.get('agent')}: {_speed(score)}{best}"),
            style="green",
        )

    def _evaluated(self, payload: dict[str, Any]) -> str:
        stages = payload.get("stages", {})
        last = stages.get("full") or stages.get("screen") or {}
        score = last.get("score")
        return (
            f"{payload.get('candidate')} ({payload.get('agent')}): "
            f"{'full' if 'full' in stages else 'screen'} "
            f"{'passed' if last.get('passed') else 'failed'}"
            + (f", {_speed(score)} over eager" if score else "")
            + (f" ({_fmt(last.get('stopped'))})" if last.get("stopped") else "")
        )
