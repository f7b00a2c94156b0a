"""ncu target: rome.apply_qk forward + backward, fp32 tables, warmed, then one step inside
cudaProfilerStart/Stop, for each workload named (profiling.workloads: default's q, k [1, 24, 28800,
128] in 44/44/40 half rotations; wan's [1, 40, 32760, 128] in 44/42/42 interleave; in turn), in the
sections' pairs as halves (launch.pairs_halves()) or the partner form.
    python3 pairsncu.py pairs|partner bf16|fp32|fp16 [default,wan]      (default: default)
DEV=cpu SMALL=1 TRITON_INTERPRET=1 rehearses it on a CPU (a small grid, two heads, no profiler)."""
import os, sys
import torch
import rome
from rome import launch
from profiling.workloads import WORKLOADS

form, dt = sys.argv[1], sys.argv[2]
names = (sys.argv[3] if len(sys.argv) > 3 else "default").split(",")
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dt]
dev, small = os.environ.get("DEV", "cuda"), bool(os.environ.get("SMALL"))
seen = []
real = __import__("rome.launcher", fromlist=["_run"])._run


def spy(fn, grid_, args, consts, *rest, **kw):
    seen.append((consts.get("HALVES"), consts.get("HALVES_RUN"), consts.get("DEPTH"), rest[0].block_r,
                 rest[0].num_warps))
    return real(fn, grid_, args, consts, *rest, **kw)


sys.modules["rome.launcher"]._run = spy


def run(name):
    w = WORKLOADS[name]
    grid = w.grid
    if small:  # (a smaller grid of the same sections, on two heads)
        w, grid = w.replace(q_heads=2, kv_heads=2), (2, 3, 4)
    m = rome.rotation_matrix(w.sections, w.mode, device=dev, dtype=torch.bfloat16)
    cos, sin = rome.rope_cos_sin(rome.grid_positions(grid, device=dev), w.sections, mode=w.mode, theta=w.theta,
                                 device=dev)
    s = grid[0] * grid[1] * grid[2]
    q = torch.randn(w.batch, w.q_heads, s, w.head_dim, device=dev).to(dtype).requires_grad_()
    k = torch.randn(w.batch, w.kv_heads, s, w.head_dim, device=dev).to(dtype).requires_grad_()

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


for name in names:
    seen.clear()
    run(name)
    print(name, form, dt, "launches (HALVES, HALVES_RUN, DEPTH, BLOCK_R, warps):", sorted(set(seen), key=str),
          "tuned:", __import__("rome.tuning", fromlist=["chosen"]).chosen(), file=sys.stderr)
