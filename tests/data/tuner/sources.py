"""Triton sources for the tuner tests (``tests/test_tunables.py``, ``tests/test_tuner.py``):
a grouped matmul with BLOCK_M/N/K, GROUP_M, num_warps, num_stages and a grid of ``cdiv``
literals; autotune config lists, inline and module-level; an elementwise kernel with a
``tl.constexpr`` BLOCK_SIZE constant; RMSNorm kernels with ROWS rows per program (the only
ones run, under ``TRITON_INTERPRET=1``, for the example ``rmsnorm_h512``)."""

from __future__ import annotations

import io
import tokenize

from kernelarc.problem.schema import Solution

MATMUL = '''"""Grouped-order matmul (fp16 in, fp32 accumulate)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * sam + (k * BLOCK_K + rk)[None, :] * sak)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))


def run(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 128) * triton.cdiv(N, 64),)  # one program per tile
    _matmul[grid](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1),
        BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, GROUP_M=8,  # tuned on H100
        num_warps=4, num_stages=3,
    )
'''

AUTOTUNE = '''"""Autotuned split-K matmul and an autotuned scale kernel (inline config list)."""
import triton
import triton.language as tl

CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "SPLIT_K": 1}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 4}, num_warps=4, num_stages=2),
]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def _mm_splitk(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    pass


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 1024}, num_warps=4)],
    key=["n"],
)
@triton.jit
def _scale(x_ptr, n, BLOCK_SIZE: tl.constexpr):
    pass


def run(a, b, c):
    grid = lambda META: (triton.cdiv(a.shape[0], META["BLOCK_M"]), META["SPLIT_K"])
    _mm_splitk[grid](a, b, c, a.shape[0], b.shape[1], a.shape[1])
    _scale[lambda META: (triton.cdiv(c.numel(), META["BLOCK_SIZE"]),)](c, c.numel())
'''

ELEMENTWISE = '''"""y = x * 2 + 1 with a constant block size."""
import triton
import triton.language as tl

BLOCK_SIZE: tl.constexpr = tl.constexpr(1024)
NUM_WARPS = 4
HIDDEN = 4096


@triton.jit
def _affine(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2 + 1, mask=mask)


def run(x, y):
    n = x.numel()
    assert n % HIDDEN == 0
    _affine[(triton.cdiv(n, BLOCK_SIZE),)](x, y, n, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)
'''

RMS_ROWS = '''"""RMSNorm, ROWS rows per program (tuner test; runs with TRITON_INTERPRET=1)."""

import torch
import triton
import triton.language as tl

EPS = 1e-6
ROWS = 2


@triton.jit
def _rms_rows(x_ptr, w_ptr, out_ptr, n_rows, n_cols, x_stride, out_stride, eps,
              BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cmask = cols < n_cols
    mask = (rows < n_rows)[:, None] & cmask[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * inv[:, None] * w[None, :]
    tl.store(out_ptr + r64 * out_stride + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    n_rows, n_cols = hidden_states.shape
    if n_rows == 0:
        return
    x = hidden_states.contiguous()
    w = weight.contiguous()
    grid = (triton.cdiv(n_rows, ROWS),)
    _rms_rows[grid](x, w, output, n_rows, n_cols, x.stride(0), output.stride(0), EPS,
                    BLOCK=triton.next_power_of_2(n_cols), ROWS=ROWS, num_warps=4)
'''

# ROWS as a literal at the launch: the grid's cdiv literal must move with it.
RMS_LITERAL = (
    RMS_ROWS.replace("ROWS = 2\n", "")
    .replace("grid = (triton.cdiv(n_rows, ROWS),)", "grid = (triton.cdiv(n_rows, 2),)")
    .replace("ROWS=ROWS, num_warps=4", "ROWS=2, num_warps=4")
)

# Two tunables of value 64 and a grid literal 64 named after neither: both are fixed.
AMBIGUOUS = """import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, TILE_A: tl.constexpr, TILE_B: tl.constexpr):
    pass


def run(x):
    _k[(triton.cdiv(x.numel(), 64),)](x, TILE_A=64, TILE_B=64, num_warps=2)
"""

SOURCES = {"mm.py": MATMUL, "auto.py": AUTOTUNE, "ew.py": ELEMENTWISE, "rms.py": RMS_ROWS}


def triton_solution(source: str, name: str = "rms_rows_seed") -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "ka_rmsnorm_h512",
            "author": "kernelarc-tests",
            "spec": {
                "languages": ["triton"],
                "entry_point": "rms.py::run",
                "destination_passing_style": True,
            },
            "sources": [{"path": "rms.py", "content": source}],
        }
    )


def differing_tokens(a: str, b: str) -> list[tuple[str, str]]:
    """The (old, new) literals where a rewrite ``b`` of ``a`` differs: only numbers may."""
    ta = list(tokenize.generate_tokens(io.StringIO(a).readline))
    tb = list(tokenize.generate_tokens(io.StringIO(b).readline))
    assert len(ta) == len(tb), "a rewrite changed the token structure"
    out = []
    for x, y in zip(ta, tb, strict=True):
        assert x.type == y.type
        if x.string != y.string:
            assert x.type == tokenize.NUMBER, (x, y)
            out.append((x.string, y.string))
    return out
