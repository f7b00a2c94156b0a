"""ncu target: rome.apply_qk_norm fused forward + backward on one workload, warmed, inside
cudaProfilerStart/Stop. python3 qkncu.py wan-qknorm|flux-qknorm"""
import sys, os, torch, rome
sys.path.insert(0, os.path.dirname(__file__))
W = {"wan-qknorm": (1, 32760, 40, 40, 128, (44, 42, 42), "interleave", "heads", (21, 30, 52)),
     "flux-qknorm": (1, 4608, 24, 24, 128, (16, 56, 56), "interleave", "head", (1, 64, 72))}
b, s, hq, hk, d, sec, mode, over, grid = W[sys.argv[1]]
dev = "cuda"
q = torch.randn(b, s, hq, d, device=dev).bfloat16().transpose(1, 2).requires_grad_()
k = torch.randn(b, s, hk, d, device=dev).bfloat16().transpose(1, 2).requires_grad_()
m = rome.rotation_matrix(sec, mode, device=dev, dtype=torch.bfloat16)
cos, sin = rome.rope_cos_sin(rome.grid_positions(grid, device=dev), sec, mode=mode, device=dev)
n = hq * d if over == "heads" else d
qw = (1 + 0.1 * torch.randn(n, device=dev)).bfloat16().requires_grad_()
kw = (1 + 0.1 * torch.randn(n, device=dev)).bfloat16().requires_grad_()
for _ in range(3):
    o = rome.apply_qk_norm(q, k, cos, sin, m, qw, kw, over=over, backend="triton")
    torch.autograd.grad(o, (q, k, qw, kw), [torch.ones_like(x) for x in o])
torch.cuda.synchronize(); torch.cuda.profiler.start()
o = rome.apply_qk_norm(q, k, cos, sin, m, qw, kw, over=over, backend="triton")
torch.autograd.grad(o, (q, k, qw, kw), [torch.ones_like(x) for x in o])
torch.cuda.synchronize(); torch.cuda.profiler.stop()
