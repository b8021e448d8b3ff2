"""``kernelarc optimize`` (run a search) and ``kernelarc status`` (report on a run)."""

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

from kernelarc.cli.status_cmd import print_status
from kernelarc.errors import KernelArcError
from kernelarc.guard.config import GuardConfig
from kernelarc.guard.evaluator import Guard
from kernelarc.guard.footprint import device_warnings
from kernelarc.orchestration.config import RunConfig, StageConfig
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


def optimize_command(
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
            min=0,
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
            help="return the best candidate even when the reference itself is faster",
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
    err = Console(stderr=True, soft_wrap=True)
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
    )
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_status(summary, Console())
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
        raise KernelArcError(f"bad options: {e}") from None
    run_dir.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(store_path)
    try:
        if resume:  # a resumed run keeps its own configuration
            config = RunConfig.model_validate(store.open_run(config.model_dump(mode="json")))
            err.print(
                f"resuming {run_dir} (budget {config.budget}, agents {','.join(config.agents)})"
            )
            if chosen is not None and chosen != config.workloads:
                err.print(
                    "[yellow]--workloads is not this run's: a resumed run judges the workloads "
                    "it started with[/]"
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
                on_event=lambda k, p: _progress(k, p, err),
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
            f"try `kernelarc report {escape(str(run_dir))}`"
        )
        return
    err.print(f"report: {escape(str(written.report))}")
    if written.note:
        err.print(f"[yellow]{escape(written.note)}[/]")


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


def _progress(kind: str, payload: dict[str, Any], err: Console) -> None:
    if kind not in _SHOWN:
        return
    if kind == "evaluated":
        stages = payload.get("stages", {})
        last = stages.get("full") or stages.get("screen") or {}
        score = last.get("score")
        text = (
            f"{payload.get('candidate')}: {'full' if 'full' in stages else 'screen'} "
            f"{'passed' if last.get('passed') else 'failed'}"
            + (f", {score:.2f}× over eager" if score else "")
            + (" [new incumbent]" if payload.get("improved") else "")
            + (f" ({last.get('stopped')})" if last.get("stopped") else "")
        )
        err.print(escape(text))
    elif kind == "no_solution" and payload.get("common_failure"):  # in full: what to fix
        err.print(escape(f"no_solution: {payload.get('why')}"), style="yellow")
        err.print(escape(str(payload["common_failure"])), style="yellow")
    else:
        err.print(escape(f"{kind}: {json.dumps(payload, default=str)[:300]}"), style="dim")
