"""The guard's worker process: ``python -m kernelarc.guard.worker --role ROLE``.

Two roles, always in separate processes:

- ``reference`` (trusted): runs the problem's reference on inputs generated from the seed
  protocol, keeps the outputs, and *judges*: it reads a candidate's outputs (raw bytes +
  JSON header, see ``protocol.py``) and applies the official comparison. It also times the
  reference (and optionally ``torch.compile`` of it) with the same protocol.
- ``candidate`` (untrusted, ``candidate.py``): imports one solution, generates the same
  inputs from the same seeds, calls the solution under the sentinel, writes its outputs.

Requests and replies are JSON objects on pipes whose descriptors are passed on the command
line; the worker's stdout and stderr are a log file the parent reads, never the channel.
A request that raises inside the guard's own code is answered with ``error: check-error``
(the parent rejects the candidate: never fail open).

A worker outlives no parent: when the parent dies without closing it (killed, out of
memory), the request pipe's write end closes and a watch thread ends the worker at once,
also in the middle of a long request (a 10-minute reference run, a hanging candidate),
instead of holding the GPU until that request finishes. Not covered: a parent that is alive
but stuck (its own deadlines are the parent's job).
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any

from kernelarc.guard.candidate import CandidateRole
from kernelarc.guard.compile_pool import raise_recompile_limits
from kernelarc.guard.cuda_ipc import ExchangeUnavailable
from kernelarc.guard.held_memory import CycleCollector, release_cached
from kernelarc.guard.messages import (
    CandidateSetup,
    Compared,
    CompareRequest,
    Done,
    Emulated,
    EmulatedRequest,
    ErrorReply,
    Message,
    OutputCheck,
    Ready,
    ReferenceRan,
    ReferenceReady,
    ReferenceSetup,
    ReferenceTimed,
    RunRequest,
    ShutdownRequest,
    TimeRequest,
    read_request,
)
from kernelarc.guard.prewarm import prewarm_inductor
from kernelarc.guard.protocol import Channel, ChannelClosed, SlotReader
from kernelarc.guard.timing import move_pool, time_calls, timing_pool
from kernelarc.guard.worker_base import environment_info, normalize_outputs, resolve_device
from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.emulation import install as install_emulation
from kernelarc.problem.inputs import generate_inputs, load_reference_module, torch_dtype
from kernelarc.problem.schema import Workload


def _idle_audit_hook(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook that checks nothing: the candidate's worker runs under the sentinel's
    audit hook, so the reference is timed under one too (the same interpreter conditions;
    docs/GUARD.md)."""


class ReferenceRole:
    """Runs the reference, caches its outputs (bounded LRU by bytes) and judges."""

    def __init__(self, msg: ReferenceSetup) -> None:
        import torch

        self.device = resolve_device(msg.device)
        # Low-precision matmuls this device lacks (NVFP4 on Hopper/CPU) run emulated, decided
        # per call; only here: candidates must bring their own kernels.
        self.emulation = install_emulation()
        self.definition = msg.definition
        self.problem_root = Path(msg.problem_root) if msg.problem_root else None
        self.module = load_reference_module(self.definition)
        # torch.compile (the optional compiled baseline) resolves functions through their
        # module by name; this process is the reference's own, so registering it is safe.
        sys.modules[self.module.__name__] = self.module
        self.cache: OrderedDict[tuple[str, int], tuple[Any, ...]] = OrderedDict()
        self.cache_bytes = 0
        self.writes: dict[str, list[str]] = {}
        """Per workload, the inputs the reference itself writes in place (a KV-cache update):
        a candidate may write those too (``session.py``), and no others."""
        self.input_notes: dict[str, list[str]] = {}
        """Notes of the input generation per workload (e.g. generated stand-ins for blobs)."""
        self.cache_limit = msg.cache_bytes
        self.compiled: Any = None
        self.reader = SlotReader()
        torch.set_grad_enabled(False)
        sys.addaudithook(_idle_audit_hook)

    def _inputs(self, workload: Workload, seed: int) -> Any:
        return generate_inputs(
            self.definition,
            workload,
            device=self.device,
            seed=seed,
            problem_root=self.problem_root,
            reference_module=self.module,
        )

    def _check_ref_outputs(self, outs: tuple[Any, ...], env: dict[str, int]) -> None:
        import torch

        specs = self.definition.outputs
        if len(outs) != len(specs):
            raise ValueError(f"reference returned {len(outs)} outputs, definition has {len(specs)}")
        for (name, spec), t in zip(specs.items(), outs, strict=True):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"reference output {name} is {type(t).__name__}")
            want = resolve_shape(spec.shape, env)
            if want is not None and tuple(t.shape) != want:
                raise ValueError(
                    f"reference output {name} has shape {tuple(t.shape)}, definition says {want}"
                )
            if t.dtype != torch_dtype(spec.dtype):
                raise ValueError(
                    f"reference output {name} is {t.dtype}, definition says {spec.dtype.value}"
                )

    def run(self, msg: RunRequest) -> ReferenceRan | ErrorReply:
        wl = msg.workload
        key = (wl.uuid, msg.seed)
        if key in self.cache:
            self.cache.move_to_end(key)
            return ReferenceRan(
                ok=True,
                cached=True,
                notes=self.input_notes.get(wl.uuid, []),
                writes=self.writes.get(wl.uuid, []),
            )
        try:
            t0 = time.monotonic()
            gen = self._inputs(wl, key[1])
            release_cached(self.device)  # the generator's temporaries (candidate.py says why)
            t1 = time.monotonic()
            self.input_notes[wl.uuid] = list(gen.notes)
            before = {n: _version(t) for n, t in gen.values.items()}
            outs = normalize_outputs(
                self.module.run(*gen.values.values()),
                len(self.definition.outputs),
                list(self.definition.outputs),
            )
            self._check_ref_outputs(outs, resolve_axes(self.definition, wl))
            phases = {"inputs": t1 - t0, "call": time.monotonic() - t1}
            self.writes[wl.uuid] = sorted(
                n
                for n, t in gen.values.items()
                if before[n] is not None and _version(t) != before[n]
            )
        except Exception as e:
            return ErrorReply(
                error="reference",
                message=f"{type(e).__name__}: {e}",
                traceback=traceback.format_exc(limit=8),
            )
        size = sum(t.numel() * t.element_size() for t in outs)
        self.cache[key] = outs
        self.cache_bytes += size
        while self.cache_bytes > self.cache_limit and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.cache_bytes -= sum(t.numel() * t.element_size() for t in old)
        return ReferenceRan(
            ok=True, cached=False, notes=gen.notes, writes=self.writes[wl.uuid], phases_s=phases
        )

    def emulated(self, msg: EmulatedRequest) -> Emulated:
        """The low-precision ops the reference has run emulated in this process so far."""
        return Emulated(ok=True, ops=[str(op) for op in self.emulation.describe()])

    def compare(self, msg: CompareRequest) -> Compared:
        # compare.py imports torch at its top: the worker imports torch only after its
        # parent watch has started (main)
        from kernelarc.guard.compare import check_output

        t0 = time.monotonic()
        wl = msg.workload
        key = (wl.uuid, msg.seed)
        if key not in self.cache:
            raise KeyError(f"no reference outputs for {key}: run them first")
        refs = self.cache[key]
        tol = msg.tolerance
        env = resolve_axes(self.definition, wl)
        checks: list[OutputCheck] = []
        for (name, spec), ref, header in zip(
            self.definition.outputs.items(), refs, msg.outputs, strict=True
        ):
            shape = resolve_shape(spec.shape, env) or ()
            try:  # the file stays: the candidate reuses it (its pages are already mapped)
                out = self.reader.read(header, self.device)
            except ExchangeUnavailable as e:  # the environment's fault, not the candidate's
                return Compared(ok=True, checks=[], exchange_failed=f"output {name}: {e}")
            except (ValueError, OSError) as e:
                checks.append(OutputCheck(status="type", message=f"output {name}: {e}"))
                continue
            res = check_output(
                name,
                out,
                ref,
                tol,
                expected_shape=tuple(shape),
                expected_dtype=torch_dtype(spec.dtype),
                device=self.device,
            )
            checks.append(res)
            del out
        size = sum(t.numel() * t.element_size() for t in refs)
        # An entry larger than the whole cache (outputs of tens of GB) is not kept once
        # judged: it would hold the memory the next round's candidate needs.
        if msg.drop or size > self.cache_limit:
            self.cache.pop(key)
            self.cache_bytes -= size
        return Compared(ok=True, checks=checks, phases_s={"compare": time.monotonic() - t0})

    def time(self, msg: TimeRequest) -> ReferenceTimed:
        import torch

        wl = msg.workload
        fn = self.module.run
        if msg.compiled:
            import torch._dynamo

            raise_recompile_limits(torch._dynamo.config)  # one graph per workload shape
            if self.compiled is None:
                self.compiled = torch.compile(self.module.run, dynamic=False)
            fn = self.compiled
        # The same pool as for candidates, built and moved by the same rule (distinct input
        # sets, as many as fit, every tensor at pool_shift's offsets in an allocation of its
        # own), so a reference is not timed on hotter caches or other placements than the
        # solutions it is compared with (timing.pool_shift).
        calls = msg.warmup + msg.iterations
        t0 = time.monotonic()
        pool = timing_pool(
            lambda seed: list(self._inputs(wl, seed).values.values()),
            msg.seeds,
            calls,
            self.device,
            cap=msg.pool_sets,
        )
        release_cached(self.device)

        def before(i: int) -> None:
            if i and i % len(pool) == 0:  # the pool wrapped: every set to a new address
                move_pool(pool, i // len(pool))

        t1 = time.monotonic()
        res = time_calls(
            lambda i: fn(*pool[i % len(pool)]),
            before,
            warmup=msg.warmup,
            iterations=msg.iterations,
            device=self.device,
            use_cupti=msg.cupti,
            min_timed_ms=msg.min_timed_ms,
            max_iterations=msg.max_iterations,
            max_timed_ms=msg.max_timed_ms,
        )
        phases = {"inputs": t1 - t0, "calls": time.monotonic() - t1}
        return ReferenceTimed(
            ok=True, summary={**res.summary(), "phases_s": phases}, samples_ms=res.samples_ms
        )


def _version(t: Any) -> int | None:
    """A tensor's in-place version counter (every in-place torch op on it or a view of it
    bumps it; the reference is trusted PyTorch code), or None for what has none."""
    import torch

    if not isinstance(t, torch.Tensor):
        return None
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors keep no counter: counted as not written
        return None


def serve(role: str, channel: Channel, warmed: Any = None) -> None:
    """Answer requests until ``shutdown`` or a closed channel. ``warmed``: the candidate
    worker's ``prewarm_inductor`` result (``--prewarm``), handed to its role."""
    handler: Any = None
    collect: CycleCollector | None = None  # made with the handler (held_memory.py says why)
    while True:
        try:
            raw = channel.recv()
        except ChannelClosed:
            return
        reply: Message
        try:
            msg = read_request(role, raw)
            if isinstance(msg, ShutdownRequest):
                channel.send(Done(ok=True).wire())
                return
            if isinstance(msg, ReferenceSetup):
                handler = ReferenceRole(msg)
                reply = ReferenceReady(ok=True, environment=environment_info(handler.device))
                collect = CycleCollector(handler.device)
            elif isinstance(msg, CandidateSetup):
                handler = CandidateRole(msg, warmed)
                reply = handler.setup_reply()
                collect = CycleCollector(handler.device)
            elif handler is None:
                reply = ErrorReply(error="check-error", message="request before setup")
            else:
                reply = getattr(handler, msg.op)(msg)
                if collect is not None:
                    collect()
                release_cached(handler.device)
        except Exception as e:
            reply = ErrorReply(
                error="check-error",
                message=f"{type(e).__name__}: {e}",
                traceback=traceback.format_exc(limit=12),
            )
        channel.send(reply.wire())


def _exit_with_parent(req_fd: int) -> None:
    """A daemon thread that ends this process when no writer of ``req_fd`` is left (the
    parent is gone). Polls for hang-up only (data waiting does not wake it); started before
    any candidate code runs, with ``os._exit`` bound now, so that neither the sentinel's
    thread snapshot nor a patched ``os._exit`` sees it."""
    end = os._exit
    watch = select.poll()
    watch.register(req_fd, 0)  # POLLHUP and POLLERR are always reported

    def run() -> None:
        while True:
            for _, event in watch.poll():
                if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    end(3)

    threading.Thread(target=run, name="kernelarc-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--role", choices=["reference", "candidate"], required=True)
    ap.add_argument("--req-fd", type=int, required=True)
    ap.add_argument("--resp-fd", type=int, required=True)
    ap.add_argument(
        "--prewarm",
        choices=["cpu", "cuda"],
        help="candidate: prepare torch.compile for this device type before the first "
        "request (early spares, which start while the previous candidate is judged)",
    )
    args = ap.parse_args(argv)
    _exit_with_parent(args.req_fd)
    channel = Channel(args.req_fd, args.resp_fd)
    import torch  # noqa: F401  (import before the ready message: workers start warm)

    channel.send(Ready(pid=os.getpid()).wire())
    warmed = None
    if args.prewarm and args.role == "candidate":
        warmed = prewarm_inductor(probe=args.prewarm == "cpu")
    serve(args.role, channel, warmed)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
