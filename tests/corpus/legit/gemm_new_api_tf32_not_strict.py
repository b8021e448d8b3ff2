# expect: PASSED
# problem: gemm_small
# why: TF32 through the new fp32_precision API without strict precision: numbers judge alone
# After this, torch's legacy precision getters raise; that must not become a check error.
import torch


def run(A, B, C):
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.matmul(A, B.T, out=C)
