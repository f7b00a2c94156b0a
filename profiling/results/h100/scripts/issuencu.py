"""ncu target: rome.apply_qk forward + backward on default (q, k [1, 24, 28800, 128], 44/44/40 half
rotations) or wan (q, k [1, 40, 32760, 128], 44/42/42 interleave), fp32 tables, warmed, inside
cudaProfilerStart/Stop: the launches whose issue time the static model disagrees on (default's
bf16 partner form, issue-heavy by the model; wan's, not). runQ.sh profiles them for the SM clock,
the issue slots used and the instructions executed (profiling/results/cpu/bound-default-bf16/).
    python3 issuencu.py default,wan bf16|fp32      (each workload warmed, then profiled, in turn)
DEV=cpu SMALL=1 TRITON_INTERPRET=1 rehearses it on a CPU (a small shape, no profiler)."""
import os, sys
import torch
import rome

W = {"default": (24, (44, 44, 40), "half", (20, 36, 40)),
     "wan": (40, (44, 42, 42), "interleave", (21, 30, 52))}
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[2]]
dev, small = os.environ.get("DEV", "cuda"), bool(os.environ.get("SMALL"))


def run(w):
    heads, sec, mode, grid = W[w]
    if small:
        heads, grid = 2, (2, 3, 4)
    m = rome.rotation_matrix(sec, mode, device=dev, dtype=torch.bfloat16)
    cos, sin = rome.rope_cos_sin(rome.grid_positions(grid, device=dev), sec, mode=mode, device=dev)
    s = grid[0] * grid[1] * grid[2]
    q = torch.randn(1, heads, s, 128, device=dev).to(dtype).requires_grad_()
    k = torch.randn(1, heads, s, 128, device=dev).to(dtype).requires_grad_()

    def step():
        o = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        torch.autograd.grad(o, (q, k), [torch.ones_like(x) for x in o])

    for _ in range(1 if small else 3):
        step()
    if dev == "cuda":
        torch.cuda.synchronize(); torch.cuda.profiler.start()
        step()
        torch.cuda.synchronize(); torch.cuda.profiler.stop()
    print(w, sys.argv[2], "ran; tuned:", __import__("rome.tuning", fromlist=["chosen"]).chosen(), file=sys.stderr)


for w in sys.argv[1].split(","):
    run(w)
