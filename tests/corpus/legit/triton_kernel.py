# expect: PASSED
# needs: triton
# languages: pytorch, triton
# why: a real Triton kernel (two rows per program); on CPU it needs TRITON_INTERPRET=1
import torch
import triton
import triton.language as tl


@triton.jit
def _rms_two_rows(x_ptr, w_ptr, o_ptr, n_rows, n_cols, stride, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    for i in range(2):
        row = tl.program_id(0) * 2 + i
        ok = col_ok & (row < n_rows)
        x = tl.load(x_ptr + row * stride + cols, mask=ok, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + 1e-6)
        tl.store(o_ptr + row * stride + cols, (x * inv * w).to(o_ptr.dtype.element_ty), mask=ok)


def run(hidden_states, weight, output):
    rows, cols = hidden_states.shape
    x = hidden_states.contiguous()
    grid = (triton.cdiv(rows, 2),)
    _rms_two_rows[grid](x, weight.contiguous(), output, rows, cols, x.stride(0),
                        BLOCK=triton.next_power_of_2(cols))
