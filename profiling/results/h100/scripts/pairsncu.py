"""ncu target: rome.apply_qk forward + backward on default (q, k [1, 24, 28800, 128], 44/44/40 half
rotations, fp32 tables), warmed, inside cudaProfilerStart/Stop, in the sections' pairs as halves
(launch.pairs_halves()) or the partner form. python3 pairsncu.py pairs|partner bf16|fp32|fp16
DEV=cpu SMALL=1 TRITON_INTERPRET=1 rehearses it on a CPU (a small shape, no profiler)."""
import os, sys
import torch
import rome
from rome import launch

form, dt = sys.argv[1], sys.argv[2]
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dt]
dev, small = os.environ.get("DEV", "cuda"), bool(os.environ.get("SMALL"))
grid, heads = ((2, 3, 4), 2) if small else ((20, 36, 40), 24)
sec = (44, 44, 40)
m = rome.rotation_matrix(sec, "half", device=dev, dtype=torch.bfloat16)
cos, sin = rome.rope_cos_sin(rome.grid_positions(grid, device=dev), sec, mode="half", device=dev)
s = grid[0] * grid[1] * grid[2]
q = torch.randn(1, heads, s, 128, device=dev).to(dtype).requires_grad_()
k = torch.randn(1, heads, s, 128, device=dev).to(dtype).requires_grad_()
seen = []
real = __import__("rome.launcher", fromlist=["_run"])._run


def spy(fn, grid_, args, consts, *rest, **kw):
    seen.append((consts.get("HALVES"), consts.get("HALVES_RUN"), consts.get("DEPTH"), rest[0].block_r,
                 rest[0].num_warps))
    return real(fn, grid_, args, consts, *rest, **kw)


sys.modules["rome.launcher"]._run = spy


def step():
    o = rome.apply_qk(q, k, cos, sin, m, backend="triton")
    torch.autograd.grad(o, (q, k), [torch.ones_like(x) for x in o])


with launch.pairs_halves(form == "pairs"):
    for _ in range(1 if small else 3):
        step()
    if dev == "cuda":
        torch.cuda.synchronize(); torch.cuda.profiler.start()
        step()
        torch.cuda.synchronize(); torch.cuda.profiler.stop()
print(form, dt, "launches (HALVES, HALVES_RUN, DEPTH, BLOCK_R, warps):", sorted(set(seen), key=str),
      "tuned:", __import__("rome.tuning", fromlist=["chosen"]).chosen(), file=sys.stderr)
