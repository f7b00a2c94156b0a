"""Host µs per call of rome.apply_qk_at with positions on three axes (default's 44/44/40 layout,
a 64-token step, bf16 q/k [1, 24|24, 64, 128]), launches captured (not run), median of 7 rounds of
2,000 calls; no_grad forward. Run once per tree: PYTHONPATH=<tree> python axes_overhead.py"""
import statistics, time, sys
import torch
import rome
from rome import launcher

layout = rome.section_layout((44, 44, 40), mode="half")
q = torch.randn(1, 24, 64, 128).to(torch.bfloat16)
k = torch.randn(1, 24, 64, 128).to(torch.bfloat16)
m = layout.matrix(torch.bfloat16, torch.device("cpu"))
cache_c, cache_s = rome.cos_sin_cache(layout, 64, dtype=torch.float32)
pos = torch.randint(0, 64, (1, 1, 64, 3))
axis = layout.axis
with launcher.capture(), torch.no_grad():
    f = lambda: rome.apply_qk_at(q, k, cache_c, cache_s, m, pos, axis=axis, backend="triton")
    for _ in range(200):
        f()
    rounds = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(2000):
            f()
        rounds.append((time.perf_counter() - t) / 2000 * 1e6)
print(sys.argv[1] if len(sys.argv) > 1 else "", f"{statistics.median(rounds):.2f} us/call", [f"{r:.2f}" for r in rounds])
