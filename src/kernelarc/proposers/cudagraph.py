"""The cuda-graph agent: the board's best (or the reference) replayed from CUDA graphs.

The candidate is a wrapper (:func:`kernelarc.proposers.wrap.wrap_solution`) whose entry
keeps one captured ``torch.cuda.CUDAGraph`` per call *signature*: for every argument its
shape, dtype, strides and device (tensors) or its type and value (anything else). Per call:

1. First call of a signature: static buffers with the callers' layouts are allocated and
   the arguments copied in (destinations too, once, so an element the base never writes
   keeps the caller's first content, the guard's poison); the base runs twice on a side
   stream (warm-up: Triton compiles, cuBLAS picks its workspace, lazy initialisation
   happens outside the capture), then once under ``torch.cuda.graph`` capture. For a
   destination-passing base the static destinations are captured too.
2. Every call (the first included) copies the caller's inputs into the static buffers on
   the caller's stream, inside the call the guard times, and replays the graph there. No
   stale input is ever replayed. The copies go as one ``torch._foreach_copy_`` (one
   multi-tensor kernel where dtypes and layouts allow): on a small workload the separate
   copies' launches cost more than their data.
3. Non destination-passing: the caller gets fresh tensors (copies of the static outputs,
   with ``clone``'s layout), so no output aliases an input or a buffer that the next call
   overwrites. Destination passing: the static outputs are copied into the caller's
   destination tensors. Both as one multi-tensor copy too.

A capture that fails raises ``RuntimeError("CUDA graph capture of ... failed for signature
...: cause")``; there is no fallback to eager: a wrapper that silently ran eagerly would be
judged (and kept) as a graph and hide why it is not one. Arguments that cannot be refreshed
in a graph (a list holding tensors, an object of unknown type) or a mix of CPU and CUDA
tensors raise TypeError/ValueError naming the argument. At most ``_KA_MAX_GRAPHS`` graphs
are kept (least recently used first out); the guard judges one workload at a time.

Calls with no CUDA tensor at all (a CPU device) run the base directly: there is no GPU
work to capture. The agent itself proposes only on CUDA devices (on CPU it returns None);
the CPU path exists so the wrapper's signature logic can be tested without a GPU.

The agent wraps the best other agent's incumbent on the board when it is a Python-group
solution (C++-group bases cannot be wrapped, see ``wrap.py``) that holds no wrap of its
own (``replays_graphs``), else the reference. It proposes again whenever the board's best
changes to a candidate it has not wrapped yet.
A wrap proposed before the board's best changed, and not yet judged (under a time limit
cheap proposals wait their turn), is rebased onto the new best (``rebase``).

Not covered: graphs across several devices, tensors nested in containers, dynamic shapes
inside one signature, bases that capture graphs by other means (``reduce-overhead``, a
drafted kernel): the nested capture fails and the verdict reports it.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, ClassVar

from kernelarc.agents.base import AgentStateError, Rebasing
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.problem.reference import reference_solution
from kernelarc.problem.schema import Definition, Solution
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import (
    count_of,
    failure_summary,
    ms_by_uuid,
    notes_of,
    score_text,
)
from kernelarc.proposers.wrap import why_not_wrappable, wrap_solution

REFERENCE_BASE = "reference"
#: The wrapper file's stem (``kernelarc_cudagraph.py``, ``kernelarc_cudagraph_<k>.py``).
GRAPH_STEM = "kernelarc_cudagraph"

#: The wrapper's body (see the module docstring); uses the constants ``wrap.py`` defines.
GRAPH_BODY = '''
import collections as _ka_collections

import torch

_KA_WARMUP = 2
_KA_MAX_GRAPHS = 8
_KA_VALUE_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _ka_describe(i, a):
    if isinstance(a, torch.Tensor):
        return ("tensor", tuple(a.shape), str(a.dtype), tuple(a.stride()), str(a.device))
    if isinstance(a, _KA_VALUE_TYPES):
        return ("value", type(a).__name__, repr(a))
    if isinstance(a, (tuple, list)):
        for v in a:
            if not isinstance(v, _KA_VALUE_TYPES):
                raise TypeError(
                    f"CUDA graph wrapper: argument {i} is a {type(a).__name__} holding a "
                    f"{type(v).__name__}; only top-level tensors can be refreshed per call"
                )
        return ("value", type(a).__name__, repr(a))
    raise TypeError(
        f"CUDA graph wrapper: argument {i} is a {type(a).__name__}, which cannot be part "
        "of a graph signature"
    )


def signature(args):
    """The capture key of one call: layout of every tensor, value of everything else."""
    return tuple(_ka_describe(i, a) for i, a in enumerate(args))


def _ka_overlaps(t):
    dims = sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1)
    need = 1
    for st, n in dims:
        if st < need:
            return True
        need = st * n
    return False


def _ka_span(t):
    return 1 + sum((n - 1) * st for st, n in zip(t.stride(), t.shape)) if t.numel() else 0


class _KaBuffer:
    """A static tensor with the caller's shape and strides (overlapping layouts such as
    expanded tensors are stored as their storage span)."""

    def __init__(self, t):
        self.span = _ka_overlaps(t)
        if self.span:
            self.flat = torch.empty(_ka_span(t), dtype=t.dtype, device=t.device)
            self.tensor = self.flat.as_strided(tuple(t.shape), tuple(t.stride()))
        else:
            self.tensor = torch.empty_strided(
                tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device
            )

    def fill_from(self, t):
        if self.span:
            if self.flat.numel():
                src = t.as_strided((self.flat.numel(),), (1,), t.storage_offset())
                self.flat.copy_(src)
        else:
            self.tensor.copy_(t)


def _ka_copy_all(dsts, srcs):
    """``dst.copy_(src)`` for every pair, as one multi-tensor launch where torch can (same
    dtype and layout; it falls back to one copy per pair otherwise): per-call launches are
    what a replayed graph is meant to save."""
    if dsts:
        torch._foreach_copy_(dsts, srcs)


class _KaGraph:
    def __init__(self, graph, buffers, static_args, outputs, kind):
        self.graph, self.buffers, self.static_args = graph, buffers, static_args
        self.outputs, self.kind = outputs, kind


_ka_graphs = _ka_collections.OrderedDict()


def _ka_signature_text(sig):
    parts = []
    for d in sig:
        if d[0] == "tensor":
            parts.append(f"{d[2]}{list(d[1])}")
        else:
            parts.append(f"{d[1]}={d[2][:20]}")
    return "(" + ", ".join(parts) + ")"


def _ka_capture(sig, args, n_in, device):
    buffers, static_args = {}, list(args)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            buffers[i] = _KaBuffer(a)
            static_args[i] = buffers[i].tensor
            # Destinations too, once: an element the base never writes keeps what the
            # caller's buffer held at capture (the guard's poison), never stale results.
            buffers[i].fill_from(a)
    caller = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(caller)
    with torch.cuda.stream(side):
        for _ in range(_KA_WARMUP):
            _ka_base(*static_args)
    caller.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            ret = _ka_base(*static_args)
    except Exception as e:
        raise RuntimeError(
            f"CUDA graph capture of {_KA_BASE_FILE}::{_KA_BASE_SYMBOL} failed for signature "
            f"{_ka_signature_text(sig)}: {type(e).__name__}: {e}"
        ) from e
    if _KA_DPS:
        outputs, kind = [buffers[i].tensor for i in range(n_in, len(args))], "dps"
    else:
        kind = "tensor" if isinstance(ret, torch.Tensor) else "tuple"
        outputs = [ret] if kind == "tensor" else list(ret) if isinstance(ret, (tuple, list)) else []
        if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
            raise TypeError(
                f"CUDA graph wrapper: {_KA_BASE_FILE}::{_KA_BASE_SYMBOL} returned "
                f"{type(ret).__name__}; only tensors (or a tuple/list of tensors) can be "
                "returned from a replayed graph"
            )
    return _KaGraph(graph, buffers, static_args, outputs, kind)


def kernelarc_entry(*args):
    cuda = [a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"]
    if not cuda:
        signature(args)  # the same argument rules as on a GPU
        return _ka_base(*args)
    others = {str(a.device) for a in args if isinstance(a, torch.Tensor)} - {str(cuda[0])}
    if others:
        raise ValueError(
            f"CUDA graph wrapper: tensors on {sorted(others)} besides {cuda[0]}; one graph "
            "replays work of one CUDA device"
        )
    n_in = len(args) - _KA_N_OUTPUTS if _KA_DPS else len(args)
    if n_in < 0:
        raise TypeError(
            f"CUDA graph wrapper: {len(args)} arguments, fewer than the {_KA_N_OUTPUTS} "
            "destinations a destination-passing call needs"
        )
    sig = signature(args)
    entry = _ka_graphs.get(sig)
    if entry is None:
        entry = _ka_capture(sig, args, n_in, cuda[0])
        _ka_graphs[sig] = entry
        while len(_ka_graphs) > _KA_MAX_GRAPHS:
            _ka_graphs.popitem(last=False)
    else:
        _ka_graphs.move_to_end(sig)
        dense = [i for i in range(n_in) if i in entry.buffers and not entry.buffers[i].span]
        _ka_copy_all([entry.buffers[i].tensor for i in dense], [args[i] for i in dense])
        for i in range(n_in):
            if i in entry.buffers and entry.buffers[i].span:
                entry.buffers[i].fill_from(args[i])
    entry.graph.replay()
    if entry.kind == "dps":
        _ka_copy_all(list(args[n_in:]), entry.outputs)
        return None
    fresh = [torch.empty_like(o) for o in entry.outputs]  # clone()'s layout, no launch yet
    _ka_copy_all(fresh, entry.outputs)
    return fresh[0] if entry.kind == "tensor" else tuple(fresh)
'''


def graph_solution(base: Solution, definition: Definition, *, name: str, what: str) -> Solution:
    """``base`` wrapped in per-signature CUDA-graph capture and replay."""
    return wrap_solution(
        base,
        definition,
        agent=CudaGraphAgent.name,
        name=name,
        description=f"CUDA-graph capture and replay (per input signature) of {what}.",
        body=GRAPH_BODY,
        stem=GRAPH_STEM,
        docstring=f"KernelArc cuda-graph agent: {what} replayed from CUDA graphs.",
    )


def replays_graphs(solution: Solution) -> bool:
    """Whether ``solution`` holds this agent's wrapper already (another agent built on a
    graph wrap, e.g. a precision policy around a graph wrap): a graph's replay cannot be
    captured in a graph again, the capture fails."""
    return any(PurePosixPath(s.path).name.startswith(GRAPH_STEM) for s in solution.sources)


class CudaGraphAgent(BuiltinAgent, Rebasing):
    """Wraps the board's best (or the reference) in CUDA-graph capture; CUDA only. A wrap
    still waiting to be judged when the board's best changes is rebased onto the new best."""

    name = "cuda-graph"
    strategy = "cuda-graph"
    who: ClassVar[str] = "cuda-graph agent"
    waits_for_board: ClassVar[bool] = True
    priority: ClassVar[int] = 10
    description: ClassVar[str] = (
        "CUDA only: the board's best (or the reference) captured in a CUDA graph per input "
        "signature, inputs copied in every call"
    )

    def __init__(self) -> None:
        super().__init__()
        self._wrapped: list[str] = []
        self._count = 0
        self._pending: dict[str, Any] | None = None

    def _choice(
        self, context: AgentContext
    ) -> tuple[str, Solution, str | None, str, dict[str, float]]:
        """The base to wrap now: the board's best wrappable incumbent of another agent, else
        the reference (key, solution, parent id, label, its latencies)."""
        others = context.board.others(self.name) if context.board else ()
        usable = sorted(
            (
                i
                for i in others
                if why_not_wrappable(i.solution) is None and not replays_graphs(i.solution)
            ),
            key=lambda i: i.score,
            reverse=True,
        )
        if usable:
            best = usable[0]
            label = f"{best.agent}'s incumbent {best.candidate_id}"
            return best.candidate_id, best.solution, best.candidate_id, label, best.latencies_ms
        base = reference_solution(
            context.definition,
            agent=self.name,
            description="The problem's reference implementation.",
        )
        return REFERENCE_BASE, base, None, "the reference", {}

    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        """The pending wrap replaced by a wrap of the board's best, when that changed since
        the proposal was made (and is not wrapped yet); the pending base may be wrapped later."""
        pending = self._pending
        if pending is None or proposal.mode == "draft" or not context.device.startswith("cuda"):
            return None
        key = self._choice(context)[0]
        if key == pending["base"] or key in self._wrapped:
            return None
        self._wrapped.remove(str(pending["base"]))
        self._count -= 1
        self._pending = None
        return self.propose(context)

    def propose(self, context: AgentContext) -> Proposal | None:
        if not context.device.startswith("cuda"):
            return None
        definition = context.definition
        self._classify(context)
        key, base, parent, label, baseline = self._choice(context)
        if key in self._wrapped:
            return None
        self._wrapped.append(key)
        self._count += 1
        self._pending = {"base": key, "label": label, "baseline_ms": dict(baseline)}
        solution = graph_solution(
            base, definition, name=f"{definition.name}-cudagraph-{self._count}", what=label
        )
        return Proposal(
            solution=solution,
            hypothesis=f"CUDA graph of {label}: one replay per call instead of one launch per "
            "kernel removes CPU launch overhead, which dominates small workloads.",
            parent_id=parent,
            mode="draft" if context.must_draft else "refine",
            tags=("cuda-graph", "board" if parent else "reference"),
        )

    def observe(self, result: CandidateResult) -> Conclusion:
        pending, self._pending = self._pending, None
        label = str(pending["label"]) if pending else "a base (no record of this proposal)"
        baseline = dict(pending["baseline_ms"]) if pending else {}
        effect, overall = self._effect(result, baseline)
        n = len(result.per_workload)
        if result.passed:
            score = score_text(result)
            claim = f"CUDA graph of {label}: passed {n}/{n} workloads, {score} over eager"
            if overall is not None:
                claim += f", {overall:.2f}x vs its base"
            if len(effect) > 1:
                best = max(effect, key=lambda k: effect[k])
                claim += f"; best on {best} ({effect[best]:.2f}x)"
        else:
            claim = f"CUDA graph of {label}: {failure_summary(result)}"
        return self._conclude(result, claim + notes_of(result), effect, ("cuda-graph",), overall)

    def _state(self) -> dict[str, object]:
        return {
            "wrapped": list(self._wrapped),
            "count": self._count,
            "pending": dict(self._pending) if self._pending is not None else None,
        }

    def _restore(self, state: dict[str, object]) -> None:
        wrapped, pending = state.get("wrapped", []), state.get("pending")
        if not isinstance(wrapped, list) or not all(isinstance(w, str) for w in wrapped):
            raise AgentStateError("cuda-graph agent state: 'wrapped' must be a list of strings")
        count = count_of(state.get("count", 0), self.who)
        if pending is not None:
            if not isinstance(pending, dict) or not {"base", "label"} <= set(pending):
                raise AgentStateError("cuda-graph agent state: 'pending' must name base and label")
            base_ms = ms_by_uuid(
                pending.get("baseline_ms", {}), "cuda-graph agent", "pending 'baseline_ms'"
            )
            pending = {**pending, "baseline_ms": base_ms}
        self._wrapped, self._count, self._pending = list(wrapped), count, pending


__all__ = ["GRAPH_BODY", "CudaGraphAgent", "graph_solution"]
