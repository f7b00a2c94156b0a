"""Under TRITON_INTERPRET=1: rome.apply_qk (backend="triton") and its backward on 44/44/40 half
sections, fp32/fp16/bf16, one program holding every head (q 2 heads, k 1: the build with LATE),
saved to OUT; compare two runs' files bit for bit with --compare A B. (``run``'s shape is an
argument: ../loop-sets/interp_check.py runs it on more heads and rows.)
    ROME_LATE=8 TRITON_INTERPRET=1 PYTHONPATH=<tree with late-partner.patch> python interp_check.py OUT"""
import sys

import torch

import rome


def run(out, q_heads=2, k_heads=1, rows=9):
    torch.manual_seed(0)
    got = {}
    for dt in (torch.bfloat16, torch.float32, torch.float16):
        m = rome.rotation_matrix((44, 44, 40), "half", dtype=torch.float32)
        q = torch.randn(1, q_heads, rows, 128).to(dt)
        k = torch.randn(1, k_heads, rows, 128).to(dt)
        cos, sin = torch.rand(rows, 128) * 2 - 1, torch.rand(rows, 128) * 2 - 1
        a, b = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        x, y = rome.apply_qk(qg, kg, cos, sin, m, backend="triton")
        ((x.float() * torch.arange(128)).sum() + (y.float() ** 2).sum()).backward()
        got[str(dt)] = (a, b, qg.grad, kg.grad)
    torch.save(got, out)


def compare(a, b):
    a, b = torch.load(a), torch.load(b)
    same = all(torch.equal(u.view(torch.int8), v.view(torch.int8)) for k in a for u, v in zip(a[k], b[k]))
    print("bit-identical" if same else "DIFFERENT")
    return same


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(0 if compare(sys.argv[2], sys.argv[3]) else 1)
    run(sys.argv[1])
