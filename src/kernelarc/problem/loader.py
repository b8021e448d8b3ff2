"""Loading problems, workloads and solutions from disk into the typed models of ``schema``.

Covered: reading ``definition.json``, ``workload.jsonl``, ``reference.py``, ``metadata.json``
and ``solution.json`` (sources inline or in files beside it); strict UTF-8 and JSON with
positions in errors; checking every workload against its definition (axes resolve, every var
axis is bound, tensor shapes resolve to non-negative sizes, input names are known, custom
inputs have an entrypoint, uuids are unique); choosing workloads by uuid, uuid prefix or index.

Not covered: generating inputs, reading safetensors blobs (``inputs``), running references.
Every error is a :class:`~kernelarc.errors.ProblemLoadError` naming the file, the 1-based line
(JSONL) and the field path. Nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kernelarc.errors import ProblemLoadError
from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.expressions import AxisError
from kernelarc.problem.schema import Definition, Solution, SourceFile, Tolerance, Workload

#: Folder names of the SOL-ExecBench subsets; a problem's parent folder with one of these
#: names gives its subset.
SUBSETS = ("L1", "L2", "Quant", "FlashInfer-Bench")
DEFINITION_FILE = "definition.json"
WORKLOADS_FILE = "workload.jsonl"
REFERENCE_FILE = "reference.py"
METADATA_FILE = "metadata.json"
SOLUTION_FILE = "solution.json"
_PROBLEM_DIR_HELP = (
    f"a problem directory holds {DEFINITION_FILE} and {WORKLOADS_FILE} "
    f"(optionally {REFERENCE_FILE} and {METADATA_FILE})"
)
_CHOICES_SHOWN = 12

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Problem:
    """One loaded problem: its definition, its workloads in file order and loader remarks."""

    definition: Definition
    workloads: tuple[Workload, ...]
    root: Path
    subset: str | None
    metadata: dict[str, Any] | None
    notes: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.definition.name

    def workload(self, uuid_or_index: str | int) -> Workload:
        """One workload by exact uuid, integer index (also as a decimal string), or a unique
        uuid prefix, tried in that order."""
        return self.workloads[self._index_of(uuid_or_index)]

    def select(self, spec: list[str]) -> list[Workload]:
        """Workloads named by ``spec`` (items as in :meth:`workload`; an item may also hold
        several, comma-separated), in the order given, each at most once. An item written
        ``!ITEM`` leaves that workload out: of the named ones, or of all of them in the
        problem's order when only left-out ones are named."""
        chosen: list[int] = []
        left_out: set[int] = set()
        for item in spec:
            for part in (p.strip() for p in str(item).split(",")):
                if part.startswith("!"):
                    left_out.add(self._index_of(part[1:].strip()))
                elif part and (index := self._index_of(part)) not in chosen:
                    chosen.append(index)
        if left_out and not chosen:
            chosen = list(range(len(self.workloads)))
        kept = [self.workloads[i] for i in chosen if i not in left_out]
        if not kept and left_out:
            raise ProblemLoadError(
                str(self.root / WORKLOADS_FILE),
                f"{self.name}: the workloads chosen leave none to judge",
            )
        return kept

    def _index_of(self, key: str | int) -> int:
        file = str(self.root / WORKLOADS_FILE)
        count = len(self.workloads)
        uuids = [w.uuid for w in self.workloads]
        if isinstance(key, int) or (
            isinstance(key, str) and key.isascii() and key.isdigit() and key not in uuids
        ):
            index = int(key)
            if 0 <= index < count:
                return index
            raise ProblemLoadError(
                file,
                f"{self.name}: workload index {index} is out of range; "
                f"there are {count} workloads (0..{count - 1}). {self._choices()}",
            )
        if key in uuids:
            return uuids.index(key)
        matches = [i for i, u in enumerate(uuids) if key and u.startswith(key)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            names = ", ".join(uuids[i] for i in matches[:_CHOICES_SHOWN])
            raise ProblemLoadError(
                file, f"{self.name}: workload prefix {key!r} is ambiguous; it matches {names}"
            )
        raise ProblemLoadError(file, f"{self.name}: no workload matches {key!r}. {self._choices()}")

    def _choices(self) -> str:
        shown = [f"{i}={w.uuid}" for i, w in enumerate(self.workloads[:_CHOICES_SHOWN])]
        more = len(self.workloads) - len(shown)
        tail = f", ... ({more} more)" if more > 0 else ""
        return f"Choose an index or a uuid (prefix): {', '.join(shown)}{tail}"


# ---------------------------------------------------------------- low-level reading


def _read_text(path: Path) -> str:
    """A file's text, strict UTF-8 (a leading BOM is accepted)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ProblemLoadError(str(path), "file does not exist") from None
    except IsADirectoryError:
        raise ProblemLoadError(str(path), "is a directory, expected a file") from None
    except OSError as e:
        raise ProblemLoadError(str(path), f"cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ProblemLoadError(
            str(path), f"not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8", line=line
        ) from None
    return text.removeprefix("\ufeff")


def _parse_json(text: str, file: Path, line: int | None = None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}" if line is None else f"column {e.colno}"
        raise ProblemLoadError(
            str(file), f"invalid JSON at {where}: {e.msg}", line=line if line else e.lineno
        ) from None


def _read_json_object(path: Path) -> dict[str, Any]:
    data = _parse_json(_read_text(path), path)
    if not isinstance(data, dict):
        raise ProblemLoadError(str(path), f"expected a JSON object, found {_json_kind(data)}")
    return data


def _json_kind(value: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def _field_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Dotted field path of a pydantic error location, without the discriminator tags that
    pydantic inserts for tagged unions (``inputs.x.scalar.value`` -> ``inputs.x.value``)."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            continue
        if isinstance(node, dict) and part not in node and node.get("type") == part:
            continue  # a union tag, not a key of the file
        out += ("." if out else "") + part
        node = node.get(part) if isinstance(node, dict) else None
    return out


def _validate(model: type[M], data: Any, file: Path, line: int | None = None) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e, data, file, line) from None


def _validation_error(
    exc: ValidationError, data: Any, file: Path, line: int | None
) -> ProblemLoadError:
    described: list[tuple[str, str]] = []
    for err in exc.errors():
        field = _field_path(tuple(err["loc"]), data)
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            field = f"{field}.type" if field else "type"
        described.append((field, msg))
    field, message = described[0]
    if len(described) > 1:
        rest = "; ".join(f"{f or '<top>'}: {m}" for f, m in described[1:4])
        more = len(described) - 4
        message += f" (also {rest}{f'; and {more} more' if more > 0 else ''})"
    return ProblemLoadError(str(file), message, line=line, field=field or None)


# ---------------------------------------------------------------- definitions


def _definition_with_notes(path: Path) -> tuple[Definition, list[str]]:
    path = Path(path)
    data = _read_json_object(path)
    notes: list[str] = []
    ref_path = path.parent / REFERENCE_FILE
    inline = data.get("reference")
    if ref_path.is_file():
        ref_text = _read_text(ref_path)
        if not inline:
            data = {**data, "reference": ref_text}
            notes.append(f"{DEFINITION_FILE} has no reference; using {REFERENCE_FILE}")
        elif isinstance(inline, str) and inline.strip() != ref_text.strip():
            notes.append(
                f"{DEFINITION_FILE}'s reference differs from {REFERENCE_FILE}; "
                f"using {DEFINITION_FILE} (as the official harness does)"
            )
    elif not inline:
        raise ProblemLoadError(
            str(path),
            f"no reference source: the field is empty or missing and there is no "
            f"{REFERENCE_FILE} beside it; add the reference's `run` function to either",
            field="reference",
        )
    return _validate(Definition, data, path), notes


def load_definition(path: Path | str) -> Definition:
    """Parse a ``definition.json`` (falling back to ``reference.py`` beside it when the
    ``reference`` field is empty or missing)."""
    return _definition_with_notes(Path(path))[0]


# ---------------------------------------------------------------- workloads


def _check_workload(
    definition: Definition, workload: Workload, file: Path, line: int, notes: set[str]
) -> None:
    def fail(message: str, field: str | None) -> ProblemLoadError:
        return ProblemLoadError(
            str(file), f"workload {workload.uuid}: {message}", line=line, field=field
        )

    unknown = [n for n in workload.inputs if n not in definition.inputs]
    if unknown and not workload.is_custom:
        raise fail(
            f"input {unknown[0]!r} is not an input of {definition.name}; "
            f"its inputs are {list(definition.inputs)}",
            f"inputs.{unknown[0]}",
        )
    if unknown:
        notes.add(
            f"custom workloads name inputs the definition lacks ({', '.join(unknown)}); "
            f"ignored, {definition.custom_inputs_entrypoint or 'the entrypoint'} makes the inputs"
        )
    if workload.is_custom and not definition.custom_inputs_entrypoint:
        raise fail(
            "has custom inputs but the definition has no custom_inputs_entrypoint; give the "
            "entrypoint in definition.json or use random/scalar/safetensors inputs",
            "inputs",
        )
    try:
        env = resolve_axes(definition, workload)
    except AxisError as e:
        raise fail(str(e).removeprefix(f"workload {workload.uuid}: "), "axes") from None
    for name, value in workload.axes.items():
        if name in definition.var_axes:
            continue
        if name in definition.axes:
            if env[name] != value:
                raise fail(
                    f"sets non-var axis {name}={value} but the definition gives {env[name]}",
                    f"axes.{name}",
                )
        else:
            notes.add(
                f"workloads set axes the definition does not declare ({name}); "
                "they are passed to custom input entrypoints only"
            )
    for kind, specs in (("inputs", definition.inputs), ("outputs", definition.outputs)):
        for tensor, spec in specs.items():
            try:
                shape = resolve_shape(spec.shape, env)
            except AxisError as e:
                raise fail(f"shape of {kind[:-1]} {tensor!r}: {e}", "axes") from None
            if shape is not None and any(d < 0 for d in shape):
                raise fail(f"{kind[:-1]} {tensor!r} resolves to negative shape {shape}", "axes")


def _workloads_with_notes(path: Path, definition: Definition) -> tuple[list[Workload], list[str]]:
    text = _read_text(path)
    workloads: list[Workload] = []
    first_line: dict[str, int] = {}
    notes: set[str] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        stripped = raw.strip()
        if not stripped:
            continue
        data = _parse_json(raw, path, line=number)
        if not isinstance(data, dict):
            raise ProblemLoadError(
                str(path),
                f"expected a JSON object per line, found {_json_kind(data)}",
                line=number,
            )
        workload = _validate(Workload, data, path, line=number)
        if workload.uuid in first_line:
            raise ProblemLoadError(
                str(path),
                f"duplicate uuid {workload.uuid} (first on line {first_line[workload.uuid]})",
                line=number,
                field="uuid",
            )
        first_line[workload.uuid] = number
        _check_workload(definition, workload, path, number, notes)
        workloads.append(workload)
    if not workloads:
        raise ProblemLoadError(
            str(path), "holds no workloads; write one JSON object per line (uuid, axes, inputs)"
        )
    ignored = sum(1 for w in workloads if "required_match_ratio" in w.tolerance.ignored_keys)
    ordered = sorted(notes)
    if ignored:
        ordered.insert(
            0,
            f"{ignored} workloads spell required_match_ratio; ignored as the official harness "
            f"does, {Tolerance().required_matched_ratio} enforced",
        )
    return workloads, ordered


def load_workloads(path: Path | str, definition: Definition) -> list[Workload]:
    """Parse a ``workload.jsonl`` (blank lines skipped) and check each line against
    ``definition``."""
    return _workloads_with_notes(Path(path), definition)[0]


# ---------------------------------------------------------------- problems


def _problem_files(path: Path) -> tuple[Path, Path]:
    if not path.exists():
        raise ProblemLoadError(str(path), f"does not exist; {_PROBLEM_DIR_HELP}")
    if path.is_dir():
        definition = path / DEFINITION_FILE
        if not definition.is_file():
            nested = next(path.glob(f"*/**/{DEFINITION_FILE}"), None)
            hint = (
                f"; it looks like a tree of problems (e.g. {nested.parent}): "
                "pass one problem directory, or list them with `kernelarc problems`"
                if nested
                else ""
            )
            raise ProblemLoadError(
                str(path),
                f"not a problem directory: no {DEFINITION_FILE}; {_PROBLEM_DIR_HELP}" + hint,
            )
    else:
        definition = path
        if path.suffix != ".json":
            raise ProblemLoadError(
                str(path), f"expected a problem directory or its {DEFINITION_FILE}"
            )
    workloads = definition.parent / WORKLOADS_FILE
    if not workloads.is_file():
        raise ProblemLoadError(
            str(workloads), f"missing beside {definition.name}; {_PROBLEM_DIR_HELP}"
        )
    return definition, workloads


def load_problem(path: Path | str) -> Problem:
    """Load a problem directory, or a ``definition.json`` with ``workload.jsonl`` beside it."""
    def_path, wl_path = _problem_files(Path(path))
    definition, notes = _definition_with_notes(def_path)
    workloads, wl_notes = _workloads_with_notes(wl_path, definition)
    notes.extend(wl_notes)
    root = def_path.parent
    meta_path = root / METADATA_FILE
    metadata = _read_json_object(meta_path) if meta_path.exists() else None
    subset = root.parent.name if root.parent.name in SUBSETS else None
    if metadata is not None:
        meta_subset = metadata.get("subset")
        if subset is None and isinstance(meta_subset, str) and meta_subset:
            subset = meta_subset
        elif isinstance(meta_subset, str) and meta_subset != subset:
            notes.append(f"folder says subset {subset}, {METADATA_FILE} says {meta_subset}")
        count = metadata.get("num_workloads")
        if isinstance(count, int) and count != len(workloads):
            notes.append(
                f"{METADATA_FILE} counts {count} workloads, {WORKLOADS_FILE} holds "
                f"{len(workloads)}; per-workload metadata may not line up"
            )
    return Problem(definition, tuple(workloads), root, subset, metadata, tuple(notes))


# ---------------------------------------------------------------- solutions


def load_solution(path: Path | str) -> Solution:
    """Parse a ``solution.json`` (or a directory holding one). A source entry with no
    ``content`` is read from the file at its ``path``, relative to the solution's folder."""
    path = Path(path)
    if path.is_dir():
        path = path / SOLUTION_FILE
    data = _read_json_object(path)
    sources = data.get("sources")
    if isinstance(sources, list):
        data = {**data, "sources": [_source_entry(path, i, s) for i, s in enumerate(sources)]}
    return _validate(Solution, data, path)


def _source_entry(solution: Path, index: int, entry: Any) -> Any:
    if not isinstance(entry, dict) or entry.get("content") is not None:
        return entry  # validation reports what is wrong with it
    rel = entry.get("path")
    field = f"sources[{index}]"
    if not isinstance(rel, str) or not rel:
        raise ProblemLoadError(
            str(solution),
            "a source needs `path`, and `content` or a file at that path",
            field=f"{field}.path",
        )
    try:
        SourceFile.model_validate({"path": rel, "content": ""})  # relative, no '..'
    except ValidationError as e:
        msg = str(e.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ProblemLoadError(str(solution), msg, field=f"{field}.path") from None
    base = solution.parent.resolve()
    file = (base / rel).resolve()
    if not file.is_relative_to(base):
        raise ProblemLoadError(
            str(solution),
            f"source {rel!r} resolves outside {base} (a link?)",
            field=f"{field}.path",
        )
    if not file.is_file():
        raise ProblemLoadError(
            str(solution),
            f"source {rel!r} has no inline content and {base / rel} does not exist; "
            "put the file beside solution.json or give `content`",
            field=f"{field}.content",
        )
    return {**entry, "content": _read_text(file)}
