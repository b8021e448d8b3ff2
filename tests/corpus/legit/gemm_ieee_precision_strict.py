# expect: PASSED
# problem: gemm_small
# strict-precision: true
# why: pins full fp32 ("ieee") through the new fp32_precision API: no downgrade, no flag
import torch


def run(A, B, C):
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.matmul(A, B.T, out=C)
