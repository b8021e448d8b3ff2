"""The candidate role of the worker: one solution, called under the sentinel.

Per correctness round: inputs are generated from the round's seed (the same seed the
reference worker gets), their state recorded (``call_checks.py``: copies, fingerprints for
large tensors), outputs pre-filled with NaN (destination passing) and the solution called.
Then: the sentinel's post-call checks, outputs must be plain tensors on the right device
that do not alias an input, inputs must be unchanged, and the outputs are written as raw
bytes for the judge.

Memory that making the inputs freed (a generator's temporaries) goes back to the driver
before the call (``held_memory.release_cached``). Left cached, such a block can be split
for a small output, which then holds all of it, and the reference worker, making its own
outputs beside it, can run out of memory (docs/GUARD.md; ``tests/guard/test_worker_memory.py``).

For timing, a pool of distinct input sets (from their own seeds) is placed at shifted
addresses; the outputs of sampled timed calls are written for the judge too, so stale or
cached results during timing are caught. A solution never sees the reference's ``run``:
its module is the reference source with ``run`` removed (custom input generators stay).

A worker hosts exactly one candidate; the parent replaces it after any failure.
"""

from __future__ import annotations

import ast
import operator
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kernelarc.guard import (
    compile_pool,
    cuda_ipc,
    messages,
    protocol,
    sentinel,
    timing,
    worker_base,
)
from kernelarc.guard.build import load_entry
from kernelarc.guard.build_base import BuildArtifact, BuildError
from kernelarc.guard.call_checks import Untouched, output_violations
from kernelarc.guard.compile_pool import compile_pass, compile_stats
from kernelarc.guard.cuda_ipc import ExchangeUnavailable
from kernelarc.guard.held_memory import release_cached
from kernelarc.guard.messages import (
    CandidateRan,
    CandidateReady,
    CandidateSetup,
    CandidateTimed,
    Done,
    ErrorReply,
    ReleaseRequest,
    RunRequest,
    Sample,
    TimeRequest,
    ViolationReport,
    Warmed,
    WarmRequest,
    Writes,
)
from kernelarc.guard.prewarm import Prewarm, prewarm_inductor, uses_inductor
from kernelarc.guard.protocol import ROUND_PARTS, WIRE_DTYPES
from kernelarc.guard.sentinel import Policy, Sentinel, Violation
from kernelarc.guard.timing import move_pool, placed, poison, time_calls, timing_pool
from kernelarc.guard.worker_base import environment_info, normalize_outputs, resolve_device
from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.inputs import generate_inputs, load_reference_module, torch_dtype
from kernelarc.problem.schema import Workload


def _without_run(source: str) -> str:
    tree = ast.parse(source)
    tree.body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "run")
    ]
    return ast.unparse(tree)


def _viol(vs: list[Violation]) -> list[ViolationReport]:
    return [ViolationReport(check=v.check, detail=v.detail) for v in vs]


class CandidateRole:
    def __init__(self, msg: CandidateSetup, warmed: Prewarm | None = None) -> None:
        """``warmed``: the worker's own :func:`prewarm_inductor`, run before its first
        request (a CUDA guard's spares), or None."""
        import torch

        # compare.py imports torch at its top: the worker imports torch only after its
        # parent watch has started (worker.main)
        from kernelarc.guard import compare

        torch.set_grad_enabled(False)
        self.device = resolve_device(msg.device)
        definition = msg.definition
        self.definition = definition
        stripped = definition.model_copy(update={"reference": _without_run(definition.reference)})
        self.gen_module = load_reference_module(stripped, name="kernelarc_inputs")
        self.dps = msg.dps
        pol, art = msg.policy, msg.artifact
        artifact = BuildArtifact(**art.model_dump())
        self.sentinel = Sentinel(
            Policy(
                candidate_dir=art.root,
                forbidden_roots=tuple(Path(p) for p in pol.forbidden_roots),
                problem_name=pol.problem_name,
                library_roots=tuple(Path(p) for p in pol.library_roots),
            )
        )
        self.notes: list[str] = []
        self._slots = protocol.SlotWriter()
        self._exporter = cuda_ipc.Exporter()
        self.timings: dict[str, float] = {}
        """Seconds of the setup's parts (``load.*`` phases in the parent)."""
        if warmed is not None:
            self.timings["spare_prewarm"] = warmed.seconds
        if uses_inductor(art.root):
            if warmed is None:
                warmed = prewarm_inductor(probe=self.device.type != "cuda")
                self.timings["prewarm"] = warmed.seconds
            self.notes += warmed.notes
            if not warmed.probe:
                self.notes.append(
                    "Inductor's CPU vector-ISA probe not run (cpp.vec_isa_ok = False on a "
                    "CUDA device): CPU kernels in the compiled graph are scalar"
                )
        self.sentinel.install()
        self.sentinel.arm(
            [
                sys.modules[__name__],
                compare,
                compile_pool,
                cuda_ipc,
                messages,
                protocol,
                sentinel,
                timing,
                worker_base,
            ]
        )
        self.fn: Any = None
        self.load_error: ErrorReply | None = None
        t0 = time.monotonic()
        try:
            self.fn = load_entry(artifact)
        except BuildError as e:
            self.load_error = ErrorReply(error="compile", message=str(e), log=e.log)
        except BaseException as e:  # an import-time crash of the solution
            self.load_error = ErrorReply(
                error="compile",
                message=f"{type(e).__name__}: {e}",
                log=traceback.format_exc(limit=8),
            )
        self.timings["entry"] = time.monotonic() - t0
        self.import_violations = self.sentinel.check_after_call() + self.sentinel.take()
        self._timed: dict[str, tuple[list[Any], list[Any]]] = {}

    def setup_reply(self) -> CandidateReady | ErrorReply:
        if self.load_error:
            return self.load_error.model_copy(
                update={
                    "violations": _viol(self.import_violations),
                    "notes": self.notes,
                    "timings": self.timings,
                }
            )
        return CandidateReady(
            ok=True,
            violations=_viol(self.import_violations),
            precision=self.sentinel.precision_changes(),
            environment=environment_info(self.device),
            notes=self.notes,
            timings=self.timings,
        )

    # ------------------------------------------------------------------ helpers
    def generate(self, workload: Workload, seed: int) -> list[Any]:
        gen = generate_inputs(
            self.definition,
            workload,
            device=self.device,
            seed=seed,
            problem_root=None,
            reference_module=self.gen_module,
        )
        return list(gen.values.values())

    def alloc_outputs(self, workload: Workload) -> list[Any]:
        import torch

        env = resolve_axes(self.definition, workload)
        outs = []
        for spec in self.definition.outputs.values():
            t = torch.empty(
                resolve_shape(spec.shape, env) or (),
                dtype=torch_dtype(spec.dtype),
                device=self.device,
            )
            poison(t)
            outs.append(t)
        return outs

    def call(self, inputs: list[Any], outputs: list[Any]) -> tuple[Any, ...]:
        return self._results(self.fn(*self._args(inputs, outputs)), outputs)

    def _args(self, inputs: list[Any], outputs: list[Any]) -> list[Any]:
        return [*inputs, *outputs] if self.dps else list(inputs)

    def _results(self, ret: Any, outputs: list[Any]) -> tuple[Any, ...]:
        """One call's outputs in definition order (the destination buffers when the solution
        is destination passing, else what it returned)."""
        if self.dps:
            return tuple(outputs)
        outs = self.definition.outputs
        return normalize_outputs(ret, len(outs), list(outs))

    def _write(
        self, outs: tuple[Any, ...], tag: str, exchange: Path, ipc: bool
    ) -> list[dict[str, Any]]:
        """Headers of the outputs for the reference worker: large CUDA outputs handed over on
        the GPU when ``ipc`` (kept alive until the next request), the rest through files."""
        import torch

        headers: list[dict[str, Any]] = []
        for name, t in zip(self.definition.outputs, outs, strict=False):
            if not isinstance(t, torch.Tensor):
                headers.append({"kind": "object", "type": type(t).__qualname__})
                continue
            dtype = str(t.dtype).removeprefix("torch.")
            if ipc and dtype in WIRE_DTYPES and self._exporter.wanted(t):
                try:
                    headers.append(self._exporter.export(t, dtype))
                    continue
                except ExchangeUnavailable as e:  # e.g. memory not from cudaMalloc
                    print(f"kernelarc: output {name} crosses through a file: {e}")
            headers.append(self._slots.write(t, exchange / f"{tag}_{name}.bin"))
        return headers

    def _bad_count(self, outs: tuple[Any, ...]) -> ErrorReply | None:
        n = len(self.definition.outputs)
        if len(outs) != n:
            return ErrorReply(
                error="outputs", message=f"returned {len(outs)} outputs, the definition has {n}"
            )
        return None

    # ------------------------------------------------------------------ requests
    def release(self, msg: ReleaseRequest) -> Done:
        """Let go of the outputs still exported to the reference worker and of the timed
        inputs kept for a re-check (before the reference is timed beside this worker)."""
        self._exporter.release()
        self._timed.clear()
        return Done(ok=True)

    def warm(self, msg: WarmRequest) -> Warmed:
        """The compile pass (``compile_pool.py``): one call per workload with Inductor's
        compile pool up, before anything is judged."""
        return compile_pass(self, msg)

    def run(self, msg: RunRequest) -> CandidateRan | ErrorReply:
        import torch

        wl = msg.workload
        seed = msg.seed
        self._exporter.release()  # the reference worker has copied what it needed
        marks = [time.monotonic()]  # where the round's time goes (diagnostics: ROUND_PARTS)
        with self.sentinel.harness():
            inputs = self.generate(wl, seed)
            outputs = self.alloc_outputs(wl) if self.dps else []
            reuse = self._timed.pop(wl.uuid, None) if msg.reuse_timed else None
            if reuse is not None:
                # Fresh values at the very addresses the last timed call used: a result
                # cached by pointer is now stale and fails the comparison.
                old_in, old_out = reuse
                for buf, new in zip(old_in, inputs, strict=True):
                    if isinstance(buf, torch.Tensor):
                        buf.copy_(new)
                # Tensors at the old addresses; values without an address (Python scalars
                # a custom input generator returns) take this round's fresh values.
                inputs = [
                    o if isinstance(o, torch.Tensor) else n
                    for o, n in zip(old_in, inputs, strict=True)
                ]
                if self.dps:
                    for buf in old_out:
                        poison(buf)
                    outputs = old_out
            release_cached(self.device)  # what making the inputs freed (module docstring)
            marks.append(time.monotonic())
            untouched = Untouched(inputs, msg.copy_bytes)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            marks.append(time.monotonic())
        try:
            outs = self.call(inputs, outputs)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            marks.append(time.monotonic())
        except BaseException as e:
            return ErrorReply(
                error="runtime",
                message=f"{type(e).__name__}: {e}",
                traceback=traceback.format_exc(limit=10),
                violations=_viol(self.sentinel.take()),
            )
        found = self.sentinel.check_after_call()
        with self.sentinel.harness():
            wrote = [  # judged by the parent against what the reference itself writes
                name
                for name, changed in zip(
                    self.definition.inputs, untouched.written(inputs), strict=True
                )
                if changed
            ]
            aliases: dict[str, str] = {}
            found += output_violations(
                self.definition, outs, inputs, self.device, self.dps, aliases
            )
            bad = self._bad_count(outs)
            if bad:
                return bad.model_copy(update={"violations": _viol(self.sentinel.take() + found)})
            ok_types = not any(v.check == "output-type" for v in found)
            marks.append(time.monotonic())
            headers = (
                self._write(outs, "slot0", Path(str(msg.exchange_dir)), msg.ipc) if ok_types else []
            )
            marks.append(time.monotonic())
        return CandidateRan(
            ok=True,
            outputs=headers,
            writes=Writes(inputs=wrote, aliases=aliases),
            violations=_viol(self.sentinel.take() + found),
            precision=self.sentinel.precision_changes(),
            phases_s=dict(zip(ROUND_PARTS, map(operator.sub, marks[1:], marks), strict=True)),
        )

    def time(self, msg: TimeRequest) -> CandidateTimed | ErrorReply:
        wl = msg.workload
        calls = msg.warmup + msg.iterations
        t0 = time.monotonic()
        self._exporter.release()
        self._timed.clear()  # a re-check not asked for: its buffers go
        with self.sentinel.harness():
            pool = timing_pool(
                lambda seed: self.generate(wl, seed),
                msg.seeds,
                calls,
                self.device,
                cap=msg.pool_sets,
            )
            seeds = msg.seeds[: len(pool)]
            outs = [placed(self.alloc_outputs(wl)) if self.dps else [] for _ in pool]
            release_cached(self.device)
        # Outputs kept for the judge: the middle timed call's and the latest call's (the
        # latest alone when the request says ``one_sample``: footprint.one_timed_call). Any
        # other call's outputs are released before the next call (outside the timed region):
        # holding every slot's outputs alive made each call allocate fresh memory, a cost
        # the reference, timed in the other worker, does not pay (docs/GUARD.md).
        kept: dict[int, Any] = {}
        mid = msg.warmup + msg.iterations // 2
        one = msg.one_sample
        k = len(pool)
        # The timed region holds the solution's call alone, as for the reference (worker.py):
        # argument lists are built, and results kept and normalised, outside it (the guard's
        # bookkeeping inside it read the reference as slower than itself, docs/GUARD.md).
        fn = self.fn
        argsets = [self._args(pool[j], outs[j]) for j in range(k)]
        t1 = time.monotonic()

        def before(i: int) -> None:
            with self.sentinel.harness():
                for idx in [x for x in kept if one or x != mid]:
                    del kept[idx]
                if i and i % k == 0:  # the pool wrapped: move every set to a new address
                    argsets[:] = [[] for _ in range(k)]  # old tensors go as each is moved
                    move_pool(pool, i // k)
                    argsets[:] = [self._args(pool[j], outs[j]) for j in range(k)]
                for t in outs[i % k]:
                    poison(t)

        def call(i: int) -> Any:
            return fn(*argsets[i % k])

        def keep(i: int, ret: Any) -> None:
            kept[i] = ret

        try:
            res = time_calls(
                call,
                before,
                warmup=msg.warmup,
                iterations=msg.iterations,
                device=self.device,
                use_cupti=msg.cupti,
                min_timed_ms=msg.min_timed_ms,
                max_iterations=msg.max_iterations,
                max_timed_ms=msg.max_timed_ms,
                keep=keep,
            )
            calls = res.calls
        except BaseException as e:
            found = self.sentinel.take()
            if "no GPU activity" in str(e):
                # CUPTI saw a timed call do nothing on the GPU, although the problem's
                # outputs live there: the results were not computed while being timed.
                found.append(Violation("recheck", f"a timed call launched no GPU work ({e})"))
            return ErrorReply(
                error="runtime",
                message=f"{type(e).__name__}: {e}",
                traceback=traceback.format_exc(limit=10),
                violations=_viol(found),
            )
        t2 = time.monotonic()
        found = self.sentinel.check_after_call()
        if res.escaped:
            found.append(Violation("stream-escape", res.escape_detail))
        with self.sentinel.harness():
            sampled = []  # with a one-set pool both calls had one seed
            for n, idx in enumerate([calls - 1] if one else sorted({mid, calls - 1})):
                if idx in kept:
                    j = idx % k
                    headers = self._write(
                        self._results(kept[idx], outs[j]),
                        f"slot{n}",  # one file per output and slot, rounds share slot0
                        Path(str(msg.exchange_dir)),
                        msg.ipc,
                    )
                    sampled.append(Sample(seed=seeds[j], outputs=headers))
            compiled = compile_stats()
        final = (calls - 1) % k
        # the re-check reuses these addresses, unless they would crowd the reference's
        # computation of the judged outputs (then it runs at fresh ones)
        self._timed = {} if one else {wl.uuid: (pool[final], outs[final])}
        pool.clear()
        outs.clear()
        kept.clear()  # the worker loop then hands cached memory back (held_memory.py)
        return CandidateTimed(
            ok=True,
            summary=res.summary(),
            samples_ms=res.samples_ms,
            pool=k,
            sampled=sampled,
            one_sample=one,
            phases_s={"inputs": t1 - t0, "calls": t2 - t1, "outputs": time.monotonic() - t2},
            torch_compile=compiled,
            violations=_viol(self.sentinel.take() + found),
            precision=self.sentinel.precision_changes(),
        )
