# expect: PASSED
# problem: gemm_small
# why: turns TF32 on, but strict precision is off, so only the numbers are judged
import torch

torch.backends.cuda.matmul.allow_tf32 = True


def run(A, B, C):
    torch.matmul(A, B.T, out=C)
