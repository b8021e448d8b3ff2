"""torch.compile's baseline as the run itself judged it.

The compiler agent's first proposal is the reference compiled as torch.compile's baseline
is (``proposers/compiler.py::BASELINE``: ``torch.compile(run, dynamic=False)``, known here
by its description). Where the run judged it and the chosen candidate with the full
protocol, their latencies give the chosen solution's speedup over torch.compile on every
workload both passed, at no device time of its own: two candidates of one run, one guard,
inputs placed by the same rule, each in a worker process of its own. The chosen candidate's
own full stage is compared, not its confirmation in a fresh process (``confirm.py``), which
the baseline never gets.

Not covered: a run without the compiler agent, or one that stopped the baseline at its
screening (hopeless against the incumbent, failed, or out of time), has no figure here;
``kernelarc eval PROBLEM -s SOLUTION --compile-baseline`` measures it directly, both sides in
one guard session.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kernelarc.proposers.compiler import BASELINE, reference_description, variant_named
from kernelarc.store.base import Store


class CompileBaseline(BaseModel):
    """The baseline's candidate, how far the run judged it, and the full-stage latencies
    (ms, by workload uuid, PASSED only) of it and of the chosen candidate."""

    model_config = ConfigDict(frozen=True)
    candidate: str
    stage: str
    """``full``, ``screen`` or ``not judged``."""
    latency_ms: dict[str, float]
    chosen: str
    chosen_latency_ms: dict[str, float]
    screen_score: float | None = None
    """Its screening's geomean speedup over the eager reference (None: it did not pass)."""
    stopped: str | None = None
    """Why its last stage stopped early (hopeless, failed, out of time), if it did."""

    def ratios(self) -> list[float]:
        """Per workload both passed in full: baseline latency / chosen latency."""
        base, ours = self.latency_ms, self.chosen_latency_ms
        return [base[u] / ours[u] for u in ours if u in base]


def _full_latencies(store: Store, candidate: str) -> dict[str, float]:
    full = [e for e in store.evaluations(candidate) if e.stage == "full"]
    per = full[-1].result.per_workload if full else ()
    return {r.uuid: r.latency_ms for r in per if r.status == "PASSED" and r.latency_ms}


def compile_baseline(store: Store, chosen: str) -> CompileBaseline | None:
    """The run's judging of torch.compile's baseline beside candidate ``chosen`` (the one
    handed over, or the one its confirmation judged again); None when the run never
    proposed the baseline."""
    want = reference_description(variant_named(BASELINE))
    for cand in store.candidates():
        if cand.agent != "compiler" or cand.solution.description != want:
            continue
        evals = store.evaluations(cand.id)
        stages = {e.stage for e in evals}
        screens = [e.result for e in evals if e.stage == "screen"]
        return CompileBaseline(
            candidate=cand.id,
            stage="full" if "full" in stages else ("screen" if stages else "not judged"),
            screen_score=screens[-1].score if screens else None,
            stopped=evals[-1].result.stopped_early if evals else None,
            latency_ms=_full_latencies(store, cand.id),
            chosen=chosen,
            chosen_latency_ms=_full_latencies(store, chosen),
        )
    return None
