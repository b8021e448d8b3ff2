"""Typed models of the SOL-ExecBench files: Definition, Workload, Solution, Trace.

Field-compatible with SOL-ExecBench: every file of its dataset parses, and what we write
(traces, solutions) uses its field names. Unknown keys are ignored on read, as the official
models do. Two compatibility rules are documented here because they change behaviour:

- ``required_match_ratio`` (the L2 spelling without "ed") is *ignored* by the official
  harness, which then enforces the default 0.99. We do the same and record the ignored key in
  ``Tolerance.ignored_keys`` so that loaders can say so.
- Older solutions spell ``spec.language`` (one of python/triton/cpp/cuda); we accept it and
  write ``spec.languages``.

Not covered here: loading from disk (``loader``), axis arithmetic (``axes``, ``expressions``), input
generation (``inputs``).
"""

from __future__ import annotations

import ast
import builtins
import math
from enum import Enum
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernelarc.problem.expressions import expression_names


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class DType(str, Enum):
    float64 = "float64"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float8_e4m3fn = "float8_e4m3fn"
    float8_e5m2 = "float8_e5m2"
    float4_e2m1 = "float4_e2m1"
    float4_e2m1fn_x2 = "float4_e2m1fn_x2"
    int64 = "int64"
    int32 = "int32"
    int16 = "int16"
    int8 = "int8"
    uint8 = "uint8"
    bool = "bool"

    @property
    def is_float(self) -> builtins.bool:
        return self.value.startswith("float") or self.value == "bfloat16"


# ---------------------------------------------------------------- definition


class ConstAxis(_Model):
    type: Literal["const"]
    value: int
    description: str | None = None


class VarAxis(_Model):
    type: Literal["var"]
    description: str | None = None


class ExprAxis(_Model):
    type: Literal["expr"]
    expression: str
    description: str | None = None


Axis = Annotated[ConstAxis | VarAxis | ExprAxis, Field(discriminator="type")]


class TensorSpec(_Model):
    """One input or output. ``shape=None``: a Python scalar; ``shape=[]``: a 0-d tensor."""

    shape: list[str] | None
    dtype: DType
    description: str | None = None

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


def _top_level_functions(source: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


class Definition(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    op_type: str | None = None
    hf_id: str | None = None
    axes: dict[str, Axis]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec] = Field(min_length=1)
    reference: str = Field(min_length=1)
    custom_inputs_entrypoint: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Definition:
        for kind, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            for name, spec in specs.items():
                for dim in spec.shape or []:
                    if dim in self.axes or dim.strip().isdigit():
                        continue
                    unknown = expression_names(dim) - set(self.axes)
                    if unknown:
                        raise ValueError(
                            f"{kind}.{name}.shape names unknown axes {sorted(unknown)}"
                        )
        for name, axis in self.axes.items():
            if isinstance(axis, ExprAxis):
                unknown = expression_names(axis.expression) - set(self.axes)
                if unknown:
                    raise ValueError(f"axes.{name}.expression uses unknown axes {sorted(unknown)}")
        try:
            funcs = _top_level_functions(self.reference)
        except SyntaxError as e:
            raise ValueError(f"reference: Python syntax error line {e.lineno}: {e.msg}") from e
        if "run" not in funcs:
            raise ValueError("reference: no top-level function `run`")
        params = [a.arg for a in funcs["run"].args.args]
        if params != list(self.inputs):
            raise ValueError(
                f"reference: run{tuple(params)} does not take the inputs in order "
                f"{tuple(self.inputs)}"
            )
        ep = self.custom_inputs_entrypoint
        if ep and ep not in funcs:
            raise ValueError(f"custom_inputs_entrypoint {ep!r} is not defined in reference")
        return self

    @property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if isinstance(a, VarAxis)]


# ---------------------------------------------------------------- workload


class Tolerance(_Model):
    max_atol: float = Field(default=1e-2, ge=0)
    max_rtol: float = Field(default=1e-2, ge=0)
    required_matched_ratio: float = Field(default=0.99, ge=0, le=1)
    max_error_cap: float | None = Field(default=None, ge=0)
    allow_negative_inf: bool = False
    ignored_keys: list[str] = Field(default_factory=list, exclude=True)
    """Keys in the file that the official harness ignores (``required_match_ratio``)."""

    @model_validator(mode="before")
    @classmethod
    def _note_ignored(cls, data: Any) -> Any:
        if isinstance(data, dict) and "required_match_ratio" in data:
            data = dict(data)
            data.pop("required_match_ratio")
            data["ignored_keys"] = ["required_match_ratio"]
        return data


class RandomInput(_Model):
    type: Literal["random"] = "random"


class ScalarInput(_Model):
    type: Literal["scalar"] = "scalar"
    value: bool | int | float


class SafetensorsInput(_Model):
    type: Literal["safetensors"] = "safetensors"
    path: str = Field(min_length=1)
    tensor_key: str = Field(min_length=1)


class CustomInput(_Model):
    type: Literal["custom"] = "custom"


InputSpec = Annotated[
    RandomInput | ScalarInput | SafetensorsInput | CustomInput, Field(discriminator="type")
]


class Workload(_Model):
    uuid: str = Field(min_length=1)
    axes: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    tolerance: Tolerance = Field(default_factory=Tolerance)

    @field_validator("tolerance", mode="before")
    @classmethod
    def _none_tolerance(cls, v: Any) -> Any:
        return {} if v is None else v

    @model_validator(mode="after")
    def _no_mixed_custom(self) -> Workload:
        custom = [n for n, s in self.inputs.items() if isinstance(s, CustomInput)]
        if custom and len(custom) != len(self.inputs):
            other = sorted(set(self.inputs) - set(custom))
            raise ValueError(f"inputs mix custom {custom} and non-custom {other}")
        return self

    @property
    def is_custom(self) -> bool:
        return any(isinstance(s, CustomInput) for s in self.inputs.values())

    def scalar_inputs(self) -> dict[str, bool | int | float]:
        return {n: s.value for n, s in self.inputs.items() if isinstance(s, ScalarInput)}


# ---------------------------------------------------------------- solution


class Language(str, Enum):
    pytorch = "pytorch"
    triton = "triton"
    cute_dsl = "cute_dsl"
    cutile = "cutile"
    cudnn_frontend = "cudnn_frontend"
    cuda_cpp = "cuda_cpp"
    cutlass = "cutlass"
    cudnn = "cudnn"
    cublas = "cublas"

    @property
    def is_cpp(self) -> bool:
        return self in CPP_LANGUAGES


CPP_LANGUAGES = frozenset({Language.cuda_cpp, Language.cutlass, Language.cudnn, Language.cublas})
_OLD_LANGUAGE = {"python": "pytorch", "triton": "triton", "cpp": "cuda_cpp", "cuda": "cuda_cpp"}


class CompileOptions(_Model):
    cflags: list[str] = Field(default_factory=list)
    cuda_cflags: list[str] = Field(default_factory=lambda: ["-O3", "--use_fast_math"])
    ld_flags: list[str] = Field(default_factory=lambda: ["-lcuda"])


class BuildSpec(_Model):
    languages: list[Language] = Field(min_length=1)
    target_hardware: list[str] = Field(default_factory=lambda: ["LOCAL"])
    entry_point: str
    destination_passing_style: bool = True
    dependencies: list[str] = Field(default_factory=list)
    compile_options: CompileOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_language(cls, data: Any) -> Any:
        if isinstance(data, dict) and "languages" not in data and "language" in data:
            data = dict(data)
            old = str(data.pop("language"))
            data["languages"] = [_OLD_LANGUAGE.get(old, old)]
        return data

    @model_validator(mode="after")
    def _check(self) -> BuildSpec:
        if self.entry_point.count("::") != 1 or not all(self.entry_point.split("::")):
            raise ValueError(f"entry_point {self.entry_point!r} must look like 'file.py::function'")
        groups = {lang.is_cpp for lang in self.languages}
        if len(groups) > 1:
            raise ValueError(
                "languages mix the Python group and the C++ group: "
                + ", ".join(lang.value for lang in self.languages)
            )
        return self

    @property
    def entry_file(self) -> str:
        return self.entry_point.split("::")[0]

    @property
    def entry_symbol(self) -> str:
        return self.entry_point.split("::")[1]

    @property
    def is_cpp(self) -> bool:
        return self.languages[0].is_cpp


class SourceFile(_Model):
    path: str = Field(min_length=1)
    content: str

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v:
            raise ValueError(f"source path {v!r} must be relative, without '..'")
        return v


#: Source text that means a solution compiles code when first called (torch.compile and
#: its relatives): its judgement includes a compile per workload shape.
RUNTIME_COMPILE_MARKERS = ("torch.compile", "torch._inductor", "torch._dynamo", "torch.export")


class Solution(_Model):
    name: str = Field(min_length=1)
    definition: str = Field(min_length=1)
    author: str = Field(min_length=1)
    description: str | None = None
    spec: BuildSpec
    sources: list[SourceFile] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Solution:
        paths = [s.path for s in self.sources]
        dup = {p for p in paths if paths.count(p) > 1}
        if dup:
            raise ValueError(f"duplicate source paths {sorted(dup)}")
        if self.spec.entry_file not in paths:
            raise ValueError(f"entry file {self.spec.entry_file!r} is not among the sources")
        return self

    def content_hash(self) -> str:
        """Hash of everything that changes behaviour (not name/author/description)."""
        import hashlib
        import json

        payload = {
            "spec": self.spec.model_dump(mode="json"),
            "sources": sorted((s.path, s.content) for s in self.sources),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def compiles_at_run_time(self) -> bool:
        """Whether a Python source mentions torch.compile or its relatives (a textual test:
        the judge's cost estimate, not a security check)."""
        return any(
            m in s.content
            for s in self.sources
            if s.path.endswith(".py")
            for m in RUNTIME_COMPILE_MARKERS
        )


# ---------------------------------------------------------------- trace


class EvaluationStatus(str, Enum):
    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"
    REWARD_HACK = "REWARD_HACK"
    INVALID_REFERENCE = "INVALID_REFERENCE"


_WITH_CORRECTNESS = {EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL}


class Correctness(_Model):
    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="strings")
    max_relative_error: float = 0.0
    max_absolute_error: float = 0.0
    has_nan: bool = False
    has_inf: bool = False
    extra: dict[str, Any] | None = None

    @field_validator("max_relative_error", "max_absolute_error")
    @classmethod
    def _nonneg(cls, v: float) -> float:
        if not math.isnan(v) and v < 0:
            raise ValueError("must be non-negative or NaN")
        return v


class Performance(_Model):
    latency_ms: float = Field(ge=0)
    reference_latency_ms: float = Field(default=0.0, ge=0)
    speedup_factor: float = Field(default=0.0, ge=0)
    extra: dict[str, Any] | None = None


class Environment(_Model):
    hardware: str = Field(min_length=1)
    libs: dict[str, str] = Field(default_factory=dict)


class Evaluation(_Model):
    status: EvaluationStatus
    log: str = ""
    environment: Environment
    timestamp: str = Field(min_length=1)
    correctness: Correctness | None = None
    performance: Performance | None = None

    @model_validator(mode="after")
    def _fields_match_status(self) -> Evaluation:
        want_c = self.status in _WITH_CORRECTNESS
        want_p = self.status == EvaluationStatus.PASSED
        if want_c != (self.correctness is not None):
            raise ValueError(
                f"status {self.status.value} must {'' if want_c else 'not '}carry correctness"
            )
        if want_p != (self.performance is not None):
            raise ValueError(
                f"status {self.status.value} must {'' if want_p else 'not '}carry performance"
            )
        return self


class Trace(_Model):
    definition: str = Field(min_length=1)
    workload: Workload
    solution: str | None = None
    evaluation: Evaluation | None = None
