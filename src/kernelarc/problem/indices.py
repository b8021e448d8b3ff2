"""Stand-ins for inputs whose safetensors blobs are missing (flashinfer-trace index tensors).

Serving problems (paged/ragged attention, MLA) read their index tensors from blobs users
often do not have. :func:`plan_missing_blobs` decides, before anything is allocated, how
each missing input can be generated, from the structure the definition states: input names
(split on ``_``), shapes and axes. It never looks at a problem's name. Recognised:

- **offsets** (``*_indptr``, ``cu_seqlens_*``; 1-D ``[L]``): ``L - 1`` segments, monotone
  from 0 to a total: the length of the same side's ``*_indices`` input (it is segmented by
  these offsets), else a ``total_*`` axis of that side, else the first axis of that side's
  data tensors (``q``/``k``/``v``...). A side is query (``q qo query``) or key/value (``kv
  k v key value page paged ckv kpe cache``), else the name's own prefix.
- **page indices** (``*_indices``; 1-D): values in ``[0, pages)``, ``pages`` being a
  ``*pages*`` axis (preferably one of a ``*cache*`` input's dims), else a cache input's
  first axis. Distinct over the whole workload when they fit, else distinct per sequence.
- **last-page lengths** (``*last_page_len*``; ``[batch]``): in ``[1, page_size]``
  (``page_size`` axis), consistent with the key/value offsets (which then count pages).
- **sequence lengths** (``*_lens``, ``*_lengths``, ``seqlens``; ``[batch]``): the token
  count of each segment of the matching offsets.
- **float tensors** (e.g. router logits): the official random rules, as for random inputs.

Coupling: with a query side and a key/value side of the same batch, every sequence gets
``kv_len >= qo_len`` (causal prefill / decode) where the totals allow it, and at least one
token per sequence where ``total >= batch``; when the totals forbid it, that is noted.
Values come from a CPU generator seeded with the workload's seed (deterministic for a seed
on every device). Every generated workload carries a note starting with ``generated
inputs`` in ``GeneratedInputs.notes``.

Not covered (these raise :class:`MissingBlobError` saying which input and why): other
integer or bool inputs (block tables, masks, token ids), 2-D index tensors, offsets with no
total to end at, indices with no page range, a group where some blobs are on disk and
others are missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelarc.errors import MissingBlobError
from kernelarc.problem.axes import resolve_shape
from kernelarc.problem.lowbit import torch_dtype_of
from kernelarc.problem.random_values import RandomContext, random_value
from kernelarc.problem.schema import ConstAxis, Definition, TensorSpec

if TYPE_CHECKING:
    import torch

GENERATED_NOTE = "generated inputs"
"""Every note of a workload with generated stand-ins starts its first note with this."""

_Q = {"q", "qo", "query", "queries"}
_KV = {"kv", "k", "v", "key", "keys", "value", "values", "page", "paged", "ckv", "kpe", "cache"}
_LENS = {"lens", "lengths", "seqlens", "seqlen", "len"}


def _tokens(name: str) -> list[str]:
    return [t for t in name.lower().split("_") if t]


def _side(prefix: list[str]) -> str:
    toks = set(prefix)
    if toks & _Q:
        return "q"
    if toks & _KV:
        return "kv"
    return "_".join(prefix)


@dataclass
class _Item:
    name: str
    kind: str  # offsets | indices | last_page | lengths | random
    side: str
    shape: tuple[int, ...] | None
    dtype: Any


def _classify(name: str, spec: TensorSpec, shape: tuple[int, ...] | None) -> _Item | str:
    """The kind of a missing input, or why it cannot be generated."""
    if spec.dtype.is_float:
        return _Item(name, "random", "", shape, spec.dtype)
    toks = _tokens(name)
    if spec.dtype.value == "bool" or shape is None or len(shape) != 1:
        return (
            f"it is a {spec.dtype.value} input of shape {list(shape) if shape else shape}; only "
            "1-D integer index tensors (indptr, indices, lengths) and float tensors can be "
            "generated"
        )
    if "indptr" in toks:
        return _Item(name, "offsets", _side([t for t in toks if t != "indptr"]), shape, spec.dtype)
    if "cu" in toks and "seqlens" in toks:
        rest = [t for t in toks if t not in ("cu", "seqlens")]
        return _Item(name, "offsets", _side(rest), shape, spec.dtype)
    if "last" in toks and "page" in toks and set(toks) & _LENS:
        rest = [t for t in toks if t not in {"last", "page"} | _LENS]
        return _Item(name, "last_page", _side(rest) if rest else "kv", shape, spec.dtype)
    if "indices" in toks:
        rest = [t for t in toks if t != "indices"]
        return _Item(name, "indices", _side(rest), shape, spec.dtype)
    if set(toks) & _LENS:
        rest = [t for t in toks if t not in _LENS]
        return _Item(name, "lengths", _side(rest), shape, spec.dtype)
    return (
        "its name names no known index structure (indptr / cu_seqlens offsets, page "
        "indices, last-page lengths, sequence lengths), so the values it must hold are unknown"
    )


def _axis_tokens(axis: str) -> set[str]:
    return set(_tokens(axis))


def _side_axes(side: str) -> set[str]:
    return _Q if side == "q" else _KV if side == "kv" else {side}


@dataclass
class MissingBlobPlan:
    """How the missing inputs of one workload are generated; see the module docstring."""

    definition: Definition
    env: Mapping[str, int]
    seed: int
    items: dict[str, _Item]
    totals: dict[str, tuple[int, str]] = field(default_factory=dict)
    """offsets name -> (total, what it equals)."""
    page_bound: dict[str, tuple[int, str]] = field(default_factory=dict)
    page_size: int = 1
    notes: list[str] = field(default_factory=list)
    _values: dict[str, Any] | None = None
    _noted: bool = False

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.items)

    def value(
        self, name: str, spec: TensorSpec, shape: tuple[int, ...] | None, ctx: RandomContext
    ) -> Any:
        """The stand-in for ``name``; index tensors are made together on the first call."""
        item = self.items[name]
        if not self._noted:
            self._noted = True
            ctx.notes.append(self.notes[0])
        if item.kind == "random":
            ctx.notes.append(f"{name}: random values in place of the missing blob")
            return random_value(name, spec, shape, ctx)
        if self._values is None:
            self._values = self._generate()
            ctx.notes.extend(self.notes[1:])
        return self._values[name].to(dtype=torch_dtype_of(item.dtype), device=ctx.dev)

    # ------------------------------------------------------------------ generation
    def _generate(self) -> dict[str, torch.Tensor]:
        import torch

        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        out: dict[str, torch.Tensor] = {}
        by = {(i.side, i.kind): i for i in self.items.values() if i.kind != "random"}
        seg_tokens: dict[str, list[int]] = {}  # side -> tokens per sequence
        q = by.get(("q", "offsets"))
        order = sorted(
            (i for i in self.items.values() if i.kind == "offsets"), key=lambda i: i.side != "q"
        )
        for item in order:
            assert item.shape is not None
            n = item.shape[0] - 1
            total, what = self.totals[item.name]
            paged = item.side == "kv" and (item.side, "indices") in by
            ps = self.page_size if paged else 1
            want = [1] * n
            coupled = q is not None and item is not q and q.shape == item.shape
            if coupled:
                want = [max(1, t) for t in seg_tokens["q"]]
            lo = [math.ceil(w / ps) for w in want]
            unit = "pages" if paged else "tokens"
            detail = f"{item.name}: {n} sequence(s), {total} {unit} in all (= {what})"
            if sum(lo) > total:  # as many non-empty sequences as the total allows
                ones = set(torch.randperm(n, generator=gen)[: min(n, total)].tolist())
                lo = [1 if i in ones else 0 for i in range(n)]
                if coupled:
                    detail += "; the totals forbid kv_len >= qo_len for every sequence"
                if total < n:
                    detail += f"; only {total} of {n} sequences can be non-empty"
            elif coupled:
                detail += "; kv_len >= qo_len per sequence (causal)"
            counts = _compose(gen, total, lo)
            self.notes.append(detail)
            out[item.name] = torch.tensor([0, *_cumsum(counts)], dtype=torch.int64)
            last = by.get((item.side, "last_page"))
            if last is not None and paged:
                lasts = []
                for c, w in zip(counts, want, strict=True):
                    low = max(1, w - (c - 1) * ps) if coupled else 1
                    lasts.append(0 if c == 0 else _randint(gen, min(low, ps), ps))
                out[last.name] = torch.tensor(lasts, dtype=torch.int64)
                tokens = [
                    0 if c == 0 else (c - 1) * ps + x for c, x in zip(counts, lasts, strict=True)
                ]
                self.notes.append(f"{last.name}: in [1, {ps}] (page_size), 0 for empty sequences")
            else:
                tokens = [c * ps for c in counts]
            seg_tokens[item.side] = tokens
            lens = by.get((item.side, "lengths"))
            if lens is not None:
                out[lens.name] = torch.tensor(tokens, dtype=torch.int64)
                self.notes.append(f"{lens.name}: token count of each sequence of {item.name}")
        for item in self.items.values():
            if item.kind == "indices":
                assert item.shape is not None
                offs = by.get((item.side, "offsets"))
                counts = out[offs.name].diff().tolist() if offs is not None else [item.shape[0]]
                bound, what = self.page_bound[item.name]
                out[item.name] = _page_indices(gen, item.shape[0], counts, bound)
                scope = (
                    "all distinct"
                    if item.shape[0] <= bound
                    else "distinct per sequence if they fit"
                )
                self.notes.append(f"{item.name}: in [0, {bound}) (= {what}), {scope}")
        return out


def _cumsum(xs: list[int]) -> list[int]:
    out, s = [], 0
    for x in xs:
        s += x
        out.append(s)
    return out


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    """Uniform in [lo, hi]."""
    import torch

    return int(torch.randint(lo, hi + 1, (1,), generator=gen).item())


def _compose(gen: torch.Generator, total: int, lo: list[int]) -> list[int]:
    """Random non-negative counts summing to ``total`` with counts[i] >= lo[i]."""
    import torch

    n, rest = len(lo), total - sum(lo)
    if n == 0:
        return []
    cuts = torch.randint(0, rest + 1, (n - 1,), generator=gen).sort().values.tolist()
    edges = [0, *cuts, rest]
    return [lo[i] + edges[i + 1] - edges[i] for i in range(n)]


def _distinct(gen: torch.Generator, k: int, bound: int) -> torch.Tensor:
    """``k`` distinct values in [0, bound), in random order."""
    import torch

    if bound <= (1 << 24):
        return torch.randperm(bound, generator=gen)[:k]
    got = torch.empty(0, dtype=torch.int64)
    while got.numel() < k:
        draw = torch.randint(0, bound, (2 * k + 16,), generator=gen)
        got = torch.unique(torch.cat([got, draw]))
    return got[torch.randperm(got.numel(), generator=gen)[:k]]


def _page_indices(gen: torch.Generator, n: int, counts: list[int], bound: int) -> torch.Tensor:
    import torch

    if n <= bound:
        return _distinct(gen, n, bound)
    parts = [
        _distinct(gen, c, bound) if c <= bound else torch.randint(0, bound, (c,), generator=gen)
        for c in counts
    ]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


# ---------------------------------------------------------------- planning


def _fail(where: str, absent: str, why: str) -> MissingBlobError:
    return MissingBlobError(f"{where}: {absent} The index generator cannot stand in: {why}.")


def _total(definition: Definition, env: Mapping[str, int], item: _Item) -> tuple[int, str] | None:
    """What the last offset must equal: a ``total_*`` axis of the side, else the first
    axis shared by the side's data tensors."""
    syn = _side_axes(item.side)
    for axis in env:
        toks = _axis_tokens(axis)
        if "total" in toks and toks & syn and axis != "total":
            return env[axis], f"axis {axis}"
    firsts = set()
    for n, spec in definition.inputs.items():
        toks = set(_tokens(n))
        if n != item.name and spec.shape and toks & syn and not toks & {"indptr", "indices"}:
            if "cache" not in toks and not (toks & _LENS):
                firsts.add(spec.shape[0])
    if len(firsts) == 1:
        axis = firsts.pop()
        if axis in env and not isinstance(definition.axes.get(axis), ConstAxis):
            return env[axis], f"first axis {axis} of the {item.side} tensors"
    return None


def _pages(
    definition: Definition, env: Mapping[str, int], item: _Item, length_axis: str | None
) -> tuple[int, str] | None:
    def is_pages(axis: str) -> bool:
        toks = _axis_tokens(axis)
        return bool(toks & {"pages", "page", "blocks"}) and not toks & {"size", "len", "per"}

    caches = [s for n, s in definition.inputs.items() if "cache" in _tokens(n) and s.shape]
    for spec in caches:
        for dim in spec.shape or []:
            if dim in env and dim != length_axis and is_pages(dim):
                return env[dim], f"axis {dim}"
    for axis in env:
        if axis != length_axis and is_pages(axis):
            return env[axis], f"axis {axis}"
    for spec in caches:
        first = spec.shape[0] if spec.shape else None
        if first is not None and first in env and first != length_axis:
            return env[first], f"first axis {first} of the caches"
    return None


def plan_missing_blobs(
    definition: Definition,
    env: Mapping[str, int],
    missing: Mapping[str, str],
    *,
    on_disk: frozenset[str],
    seed: int,
    where: str,
) -> MissingBlobPlan:
    """Decide how to generate the inputs in ``missing`` (name -> why its blob is absent);
    ``on_disk`` names the workload's blob inputs that are present. Raises
    :class:`MissingBlobError` naming the first input that cannot be generated and why."""
    items: dict[str, _Item] = {}
    for name, absent in missing.items():
        spec = definition.inputs.get(name)
        if spec is None:  # not an input of the definition: never read
            continue
        got = _classify(name, spec, resolve_shape(spec.shape, env))
        if isinstance(got, str):
            raise _fail(where, absent, got)
        items[name] = got
    plan = MissingBlobPlan(definition, env, seed, items)
    page_axes = [a for a in env if {"page", "size"} <= _axis_tokens(a)]
    plan.page_size = env[page_axes[0]] if page_axes else 1
    defined: dict[tuple[str, str], _Item] = {}
    for n, s in definition.inputs.items():
        got = _classify(n, s, resolve_shape(s.shape, env))
        if not isinstance(got, str) and got.kind != "random":
            defined[(got.side, got.kind)] = got
    seen: set[tuple[str, str]] = set()
    for item in items.values():
        if item.kind == "random":
            continue
        absent = missing[item.name]
        key = (item.side, item.kind)
        if key in seen:
            raise _fail(where, absent, f"two {item.kind} inputs on one side")
        seen.add(key)
        partners = [
            d.name for (side, _), d in defined.items() if side == item.side and d.name in on_disk
        ]
        if partners:
            raise _fail(
                where,
                absent,
                f"{partners} of the same index group are read from disk; generated values "
                "would not be consistent with them",
            )
        if item.kind == "offsets":
            assert item.shape is not None
            if item.shape[0] < 1:
                raise _fail(where, absent, "an offsets tensor needs length >= 1")
            idx = defined.get((item.side, "indices"))
            if idx is not None and idx.shape is not None:
                dims = definition.inputs[idx.name].shape or ["?"]
                plan.totals[item.name] = (idx.shape[0], f"length of {idx.name}, axis {dims[0]}")
            else:
                found = _total(definition, env, item)
                if found is None:
                    raise _fail(
                        where,
                        absent,
                        f"no total for its last element: no {item.side}-side *_indices "
                        "input, no total_* axis and no data tensor of that side",
                    )
                plan.totals[item.name] = found
        elif item.kind == "indices":
            dims = definition.inputs[item.name].shape or []
            found = _pages(definition, env, item, dims[0] if dims else None)
            if found is None:
                raise _fail(where, absent, "no *pages* axis and no *cache* input bound it")
            if found[0] <= 0 and item.shape and item.shape[0] > 0:
                raise _fail(where, absent, f"its range ({found[1]}) is empty")
            plan.page_bound[item.name] = found
        else:
            offs = defined.get((item.side, "offsets"))
            if offs is None or offs.name not in items or offs.shape is None:
                raise _fail(
                    where,
                    absent,
                    f"it needs {item.side}-side offsets (*_indptr) generated with it",
                )
            if item.shape is None or item.shape[0] != offs.shape[0] - 1:
                raise _fail(where, absent, f"its length is not len({offs.name}) - 1")
            if item.kind == "last_page" and (
                not page_axes or (item.side, "indices") not in defined
            ):
                raise _fail(where, absent, "no page_size axis or no page indices")
    names = sorted(n for n, i in items.items() if i.kind != "random")
    kinds = sorted(n for n, i in items.items() if i.kind == "random")
    plan.notes.insert(
        0,
        f"{GENERATED_NOTE}: the safetensors blobs of {', '.join(names + kinds)} are missing; "
        "these inputs were generated from the seed to fit the workload's axes, not read "
        "from the captured data (results are not comparable with runs on the real blobs)",
    )
    return plan


__all__ = ["GENERATED_NOTE", "MissingBlobPlan", "plan_missing_blobs"]
