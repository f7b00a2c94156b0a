"""Under TRITON_INTERPRET=1: rome.apply_qk (backend="triton") and its backward on 44/44/40 half
sections, fp32/fp16/bf16, q 11 heads and k 6, 17 rows (three T tiles, the last partly masked),
saved to OUT; compare two runs' files bit for bit with --compare A B.
The interpreter's launch walks 3 heads a program (rome.launcher: the SEAM build, where PING takes
no effect); here every program walks all 17 heads (launch.gather_groups' ``heads``, replaced as
the GPU's launch of default's shapes has it: one group, q's heads then k's), so the loop of PING's
sets runs more than one iteration and ends on sets past each tensor's last head. Both runs of a
comparison take that launch.
    PING=1 ROME_GATHER_DEPTH=2 TRITON_INTERPRET=1 PYTHONPATH=<tree with loop-sets.patch> python interp_check.py OUT"""
import sys

import torch

import rome
from rome import launch

_groups = launch.gather_groups


def _all_heads(cfg, n_t, ha, hb, sms, **kw):
    return _groups(cfg, n_t, ha, hb, sms, **{**kw, "heads": ha + hb})


launch.gather_groups = _all_heads


def run(out):
    torch.manual_seed(0)
    got = {}
    for dt in (torch.bfloat16, torch.float32, torch.float16):
        m = rome.rotation_matrix((44, 44, 40), "half", dtype=torch.float32)
        q = torch.randn(1, 11, 17, 128).to(dt)
        k = torch.randn(1, 6, 17, 128).to(dt)
        cos, sin = torch.rand(17, 128) * 2 - 1, torch.rand(17, 128) * 2 - 1
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
