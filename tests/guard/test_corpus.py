"""The guard corpus: every file of tests/corpus judged by the real guard.

Each corpus file is one candidate solution with a header saying what the guard must
decide (see tests/corpus/README.md). This module checks the headers themselves (always),
then evaluates every file with ``Guard.evaluate`` on the two smallest workloads of its
example problem and asserts each trace's status, and for REWARD_HACK that the log starts
with ``REWARD_HACK[<check>]``. The bundled example solutions are judged the same way.

Covered: every reward-hack check the guard names (at least one evil file each), plain
failures (crash, segfault, timeout, wrong values/shape/dtype, compile errors), and legit
but unusual solutions that must pass without a false alarm. The parent environment carries
a fake OPENAI_API_KEY so that a candidate can check that secrets do not reach it.

The verdicts of the files a session selects are judged in the background from the first
test on, ``LANES`` (``_shared``) at a time, each lane with guards and workers of its own (as
a loaded machine would run them: no file comes near its time limit but the ones that hang);
each test waits for its own file's verdict and checks it.

Not covered: timing figures, the SOL score. Files marked ``needs: cuda`` only run with a
GPU (device ``cuda``); everything else runs on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from _shared import LANES

from kernelarc.examples import example_dir, example_solutions
from kernelarc.problem.axes import resolve_axes
from kernelarc.problem.schema import BuildSpec, EvaluationStatus, Solution, SourceFile

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
CHECKS = (
    "timer-patch", "guard-integrity", "threads", "output-type", "output-aliases-input",
    "input-mutation", "recheck", "stream-escape", "file-access", "subprocess", "network",
    "binary-load", "env-tamper", "precision",
)  # fmt: skip
PROBLEMS = ("rmsnorm_h512", "gemm_small")
HEADER_KEYS = {
    "expect", "why", "problem", "dps", "needs", "timeout", "strict-precision", "extra",
    "languages",
}  # fmt: skip
FAKE_SECRET = "sk-kernelarc-corpus-not-a-real-key"
DEFAULT_TIMEOUT = 60.0
_EXPECT = re.compile(r"^(?P<status>[A-Z_]+)(?:\[(?P<check>[a-z-]+)\])?$")
_NO_TRITON_DRIVER = "active drivers"  # Triton's error when it has no GPU and no interpreter


@dataclasses.dataclass(frozen=True)
class Case:
    path: Path
    status: EvaluationStatus
    check: str | None
    why: str
    problem: str = "rmsnorm_h512"
    dps: bool = True
    needs: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    strict_precision: bool = False
    extra: tuple[str, ...] = ()
    languages: tuple[str, ...] = ("pytorch",)

    @property
    def rel(self) -> str:
        return self.path.relative_to(CORPUS).as_posix()


def parse_header(path: Path) -> Case:
    """Read a corpus file's leading ``# key: value`` lines; raise ValueError on a bad one."""
    fields: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        key = key.strip()
        if not sep or key not in HEADER_KEYS:
            continue  # a prose comment line, e.g. a second line of explanation
        if key in fields:
            raise ValueError(f"{path.name}: header key {key!r} given twice")
        fields[key] = value.strip()
    for required in ("expect", "why"):
        if not fields.get(required):
            raise ValueError(f"{path.name}: header has no '# {required}: ...' line")
    m = _EXPECT.match(fields["expect"])
    if not m:
        raise ValueError(f"{path.name}: bad expect {fields['expect']!r}")
    status = EvaluationStatus(m.group("status"))
    check = m.group("check")
    if (status == EvaluationStatus.REWARD_HACK) != (check is not None):
        raise ValueError(f"{path.name}: REWARD_HACK needs a [check] and nothing else takes one")
    if check is not None and check not in CHECKS:
        raise ValueError(f"{path.name}: unknown check {check!r}")
    problem = fields.get("problem", "rmsnorm_h512")
    if problem not in PROBLEMS:
        raise ValueError(f"{path.name}: unknown problem {problem!r}")
    needs = fields.get("needs")
    if needs not in (None, "cuda", "triton"):
        raise ValueError(f"{path.name}: unknown needs {needs!r}")
    flags = {k: fields.get(k, d).lower() for k, d in (("dps", "true"), ("strict-precision", ""))}
    if flags["dps"] not in ("true", "false") or flags["strict-precision"] not in ("", "true"):
        raise ValueError(f"{path.name}: dps / strict-precision must be true or false")
    extra = tuple(e.strip() for e in fields.get("extra", "").split(",") if e.strip())
    for e in extra:
        if not (path.parent / e).is_file():
            raise ValueError(f"{path.name}: extra source {e!r} does not exist")
    languages = tuple(x.strip() for x in fields.get("languages", "pytorch").split(","))
    return Case(
        path=path,
        status=status,
        check=check,
        why=fields["why"],
        problem=problem,
        dps=flags["dps"] == "true",
        needs=needs,
        timeout=float(fields.get("timeout", DEFAULT_TIMEOUT)),
        strict_precision=flags["strict-precision"] == "true",
        extra=extra,
        languages=languages,
    )


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*/*.py") if not p.name.startswith("_"))


CASES = [parse_header(p) for p in corpus_files()]


def build_solution(case: Case, definition_name: str) -> Solution:
    sources = [SourceFile(path=case.path.name, content=case.path.read_text(encoding="utf-8"))]
    for e in case.extra:
        extra = case.path.parent / e
        sources.append(SourceFile(path=extra.name, content=extra.read_text(encoding="utf-8")))
    spec = BuildSpec.model_validate(
        {
            "languages": list(case.languages),
            "entry_point": f"{case.path.name}::run",
            "destination_passing_style": case.dps,
        }
    )
    return Solution(
        name=f"corpus_{case.path.parent.name}_{case.path.stem}",
        definition=definition_name,
        author="kernelarc-corpus",
        description=case.why,
        spec=spec,
        sources=sources,
    )


# ---------------------------------------------------------------- headers (no guard)


def test_corpus_headers_are_valid_and_cover_every_check() -> None:
    assert len(CASES) == len(corpus_files()) > 0
    evil = {c.check for c in CASES if c.path.parent.name == "evil" and c.check}
    assert evil == set(CHECKS), f"checks without an evil file: {set(CHECKS) - evil}"
    legit = [c for c in CASES if c.path.parent.name == "legit"]
    assert legit and all(c.status == EvaluationStatus.PASSED for c in legit)
    assert {c.path.parent.name for c in CASES} <= {"evil", "legit"}


def test_parse_header_rejects_bad_headers(tmp_path: Path) -> None:
    bad = {
        "no_expect.py": "# why: x\n",
        "no_why.py": "# expect: PASSED\n",
        "unknown_check.py": "# expect: REWARD_HACK[made-up]\n# why: x\n",
        "check_on_pass.py": "# expect: PASSED[threads]\n# why: x\n",
        "bare_hack.py": "# expect: REWARD_HACK\n# why: x\n",
        "bad_dps.py": "# expect: PASSED\n# dps: maybe\n# why: x\n",
        "missing_extra.py": "# expect: PASSED\n# extra: nope.py\n# why: x\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text + "def run(a, b, c):\n    pass\n")
        with pytest.raises(ValueError):
            parse_header(tmp_path / name)
    (tmp_path / "ok.py").write_text("# expect: REWARD_HACK[threads]\n# dps: false\n# why: y\n")
    case = parse_header(tmp_path / "ok.py")
    assert (case.status, case.check, case.dps) == (EvaluationStatus.REWARD_HACK, "threads", False)


# ---------------------------------------------------------------- through the guard

GuardGetter = Callable[..., tuple[Any, Any]]
Verdicts = dict[str, Future[Any]]


@pytest.fixture(scope="module")
def guards() -> Iterator[GuardGetter]:
    """One Guard per (problem, device, timeout, strict) and lane for the whole module. Every
    check runs as configured by default; only the timing is cut to what the verdicts need:
    exactly ``warmup`` + ``iterations`` timed calls (no extension for tiny kernels) and no
    reference timing (no test here reads a speed-up)."""
    from kernelarc.guard.evaluator import Guard, GuardConfig
    from kernelarc.problem.loader import load_problem

    with pytest.MonkeyPatch.context() as mp, contextlib.ExitStack() as stack:
        mp.setenv("OPENAI_API_KEY", FAKE_SECRET)
        cache: dict[tuple[str, str, float, bool, int], tuple[Any, Any]] = {}

        def get(
            problem_name: str, device: str, timeout: float, strict: bool, lane: int = 0
        ) -> tuple[Any, Any]:
            key = (problem_name, device, timeout, strict, lane)
            if key not in cache:
                problem = load_problem(example_dir(problem_name))
                config = GuardConfig(
                    device=device,
                    timeout=timeout,
                    rounds=10,
                    warmup=2,
                    iterations=5,
                    min_timed_ms=0.0,
                    strict_precision=strict,
                    time_reference=False,
                )
                cache[key] = (problem, stack.enter_context(Guard(problem, config)))
            return cache[key]

        yield get


@dataclasses.dataclass(frozen=True)
class Job:
    """One solution to judge, and the guard it is judged by."""

    solution: Solution
    problem: str
    device: str
    timeout: float
    strict: bool


@functools.cache
def _problem(name: str) -> Any:
    """The example problem ``name``, loaded once (for its name and workloads; each guard
    loads its own)."""
    from kernelarc.problem.loader import load_problem

    return load_problem(example_dir(name))


def _job(item: pytest.Item) -> Job | None:
    """The judgement ``item`` (a test of this module) checks; None for the other tests and
    for files this machine cannot run (their test skips)."""
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    try:
        if "case" in params:
            case: Case = params["case"]
            device = _device_for(case.needs)
            solution = build_solution(case, _problem(case.problem).definition.name)
            return Job(solution, case.problem, device, case.timeout, case.strict_precision)
        if "key" in params:
            problem_name, file_name, strict = params["key"]
            device = _device_for(EXAMPLE_VERDICTS[params["key"]][0])
            path = example_dir(problem_name) / file_name
            solution = Solution.model_validate_json(path.read_text())
            return Job(solution, problem_name, device, DEFAULT_TIMEOUT, strict)
    except pytest.skip.Exception:
        return None
    return None


@pytest.fixture(scope="module")
def verdicts(request: pytest.FixtureRequest, guards: GuardGetter) -> Iterator[Verdicts]:
    """The guard's result (or the error it raised) for every test of this module in the
    session, by node id, as a future: judged in the background, ``LANES`` at once, while
    each test waits for its own (so the time limit of each test covers its own wait, not
    the whole corpus). The jobs of the guard most of them need are shared by every lane;
    those of each other guard go to one lane (whose guard then starts once), before it takes
    shared ones. The fixture's end stops the lanes taking new jobs and waits for them. A
    test missing here (none should be) judges its file itself."""
    here = request.node.path
    jobs: dict[tuple[Any, ...], list[tuple[Future[Any], Job]]] = {}
    results: Verdicts = {}
    for item in request.session.items:
        job = _job(item) if item.path == here else None
        if job is not None:
            key = (job.problem, job.device, job.timeout, job.strict)
            results[item.nodeid] = Future()
            jobs.setdefault(key, []).append((results[item.nodeid], job))
    by_size = sorted(jobs.values(), key=len, reverse=True)
    queues: list[queue.Queue[tuple[Future[Any], Job]]] = [queue.Queue() for _ in range(LANES + 1)]
    for n, group in enumerate(by_size):  # queues[LANES]: shared
        for entry in group:
            queues[LANES if n == 0 else (n - 1) % LANES].put(entry)
    done = threading.Event()

    def lane(i: int) -> None:
        while not done.is_set():
            try:
                future, job = queues[i].get_nowait()
            except queue.Empty:
                try:
                    future, job = queues[LANES].get_nowait()
                except queue.Empty:
                    return
            try:
                problem, guard = guards(job.problem, job.device, job.timeout, job.strict, i)
                workloads = _smallest_workloads(problem)
                future.set_result(guard.evaluate(job.solution, workloads=workloads))
            except Exception as e:  # the test raises it
                future.set_exception(e)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(LANES)]
    for t in threads:
        t.start()
    try:
        yield results
    finally:
        done.set()
        for t in threads:
            t.join()


def _smallest_workloads(problem: Any, n: int = 2) -> list[Any]:
    definition = problem.definition

    def size(w: Any) -> tuple[int, ...]:
        env = resolve_axes(definition, w)
        return tuple(env[a] for a in definition.var_axes)

    return sorted(problem.workloads, key=size)[:n]


def _device_for(needs: str | None) -> str:
    import torch

    if needs == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
        return "cuda"
    if needs == "triton":
        pytest.importorskip("triton")
    return "cpu"


def _judge(
    guards: GuardGetter,
    solution: Solution,
    *,
    judged: Future[Any] | None,
    problem_name: str,
    device: str,
    timeout: float,
    strict: bool,
    status: EvaluationStatus,
    check: str | None,
    what: str,
    triton: bool,
) -> None:
    """Check ``judged``, the guard's result for ``solution`` to come (judged here when None;
    ``result()`` raises what the guard raised)."""
    workloads = _smallest_workloads(_problem(problem_name))
    if judged is None:
        _, guard = guards(problem_name, device, timeout, strict)
        result = guard.evaluate(solution, workloads=workloads)
    else:
        result = judged.result()
    assert sorted(t.workload.uuid for t in result.traces) == sorted(w.uuid for w in workloads)
    for trace in result.traces:
        ev = trace.evaluation
        assert ev is not None, f"{what}: trace without an evaluation"
        detail = f"{what} on {trace.workload.uuid}: got {ev.status.value}\nlog: {ev.log[:3000]}"
        if triton and device == "cpu" and _NO_TRITON_DRIVER in ev.log:
            pytest.skip(f"the guard does not run Triton interpreted on CPU: {detail}")
        assert ev.status == status, detail
        if check is not None:
            assert ev.log.startswith(f"REWARD_HACK[{check}]"), detail
        if status == EvaluationStatus.PASSED:
            assert ev.performance is not None and ev.performance.latency_ms > 0, detail


@pytest.mark.parametrize("case", CASES, ids=[c.rel for c in CASES])
def test_corpus_file(
    case: Case, guards: GuardGetter, verdicts: Verdicts, request: pytest.FixtureRequest
) -> None:
    device = _device_for(case.needs)
    _judge(
        guards,
        build_solution(case, _problem(case.problem).definition.name),
        judged=verdicts.get(request.node.nodeid),
        problem_name=case.problem,
        device=device,
        timeout=case.timeout,
        strict=case.strict_precision,
        status=case.status,
        check=case.check,
        what=f"{case.rel} ({case.why})",
        triton="triton" in case.languages,
    )


# (problem, solution file, strict precision) -> (needs, expected status, check)
EXAMPLE_VERDICTS: dict[tuple[str, str, bool], tuple[str | None, str, str | None]] = {
    ("rmsnorm_h512", "solution_pytorch.json", False): (None, "PASSED", None),
    ("rmsnorm_h512", "solution_triton.json", False): ("triton", "PASSED", None),
    ("rmsnorm_h512", "solution_cuda.json", False): ("cuda", "PASSED", None),
    ("gemm_small", "solution_pytorch.json", False): (None, "PASSED", None),
    ("gemm_small", "solution_pytorch.json", True): (None, "PASSED", None),
    ("gemm_small", "solution_tf32.json", False): (None, "PASSED", None),
    ("gemm_small", "solution_tf32.json", True): (None, "REWARD_HACK", "precision"),
}


def test_every_example_solution_has_a_verdict() -> None:
    files = {(p.parent.name, p.name) for n in PROBLEMS for p in example_solutions(n)}
    assert files == {(prob, f) for prob, f, _ in EXAMPLE_VERDICTS}


@pytest.mark.parametrize(
    "key", sorted(EXAMPLE_VERDICTS), ids=lambda k: f"{k[0]}/{k[1]}{'-strict' if k[2] else ''}"
)
def test_example_solution_verdict(
    key: tuple[str, str, bool],
    guards: GuardGetter,
    verdicts: Verdicts,
    request: pytest.FixtureRequest,
) -> None:
    problem_name, file_name, strict = key
    needs, status, check = EXAMPLE_VERDICTS[key]
    device = _device_for(needs)
    solution = Solution.model_validate_json((example_dir(problem_name) / file_name).read_text())
    _judge(
        guards,
        solution,
        judged=verdicts.get(request.node.nodeid),
        problem_name=problem_name,
        device=device,
        timeout=DEFAULT_TIMEOUT,
        strict=strict,
        status=EvaluationStatus(status),
        check=check,
        what=f"example {problem_name}/{file_name}",
        triton=needs == "triton",
    )
