"""The fused QK-norm over heads (wan-qknorm: q, k bf16 [1, 32760, 40, 128] projections viewed as
[B, H, S, D], norm over all 40 heads, Wan's 44/42/42 interleave) on a GPU: the fused forward's and
backward's kernel us (ab.kernel_us: torch.profiler, median of 20) for the rome that PYTHONPATH
names, and, where that rome has launcher.NORM_GRAD_HEADS_TILE, for each backward tile given
(rows x warps). Gradients of every tile against the first's (same tree): max |diff| / max |value|.
python3 tiles.py LABEL [8x4,4x4,...]  -> one JSON object on stdout, a line per row on stderr."""
import json, os, sys
import torch
import rome
from rome import launcher
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "profiling/results/h100/scripts"))
sys.path.insert(0, "profiling/results/h100/scripts")
from ab import kernel_us
DEV = os.environ.get("DEV", "cuda")
if DEV != "cuda":  # a CPU rehearsal: DEV=cpu TRITON_INTERPRET=1 (small shapes, no timing)
    kernel_us = lambda fn: (fn(), (1.0, {}))[1]  # noqa: E731
    torch.cuda.get_device_name = lambda: "cpu"

label = sys.argv[1]
tiles = [tuple(map(int, t.split("x"))) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [None]
wl = {"wan-qknorm": (32760, 40, (44, 42, 42), "interleave", (21, 30, 52))}
if DEV != "cuda":
    wl = {"wan-qknorm": (12, 5, (44, 42, 42), "interleave", (1, 3, 4))}
out = {"label": label, "rome": rome.__file__, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
       "triton": __import__("triton").__version__, "rows": []}
for name, (s, h, sec, mode, grid) in wl.items():
    g = torch.Generator(device=DEV).manual_seed(0)
    q = torch.randn(1, s, h, 128, device=DEV, generator=g).bfloat16().transpose(1, 2)
    k = torch.randn(1, s, h, 128, device=DEV, generator=g).bfloat16().transpose(1, 2)
    m = rome.rotation_matrix(sec, mode, device=DEV, dtype=torch.bfloat16)
    cos, sin = rome.rope_cos_sin(rome.grid_positions(grid, device=DEV), sec, mode=mode, device=DEV)
    qw = (1 + 0.1 * torch.randn(h * 128, device=DEV, generator=g)).bfloat16()
    kw = (1 + 0.1 * torch.randn(h * 128, device=DEV, generator=g)).bfloat16()
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    copy_us, _ = kernel_us(lambda: (qo.copy_(q), ko.copy_(k)))
    fwd_us, fdet = kernel_us(lambda: rome.apply_qk_norm(q, k, cos, sin, m, qw, kw, over="heads", backend="triton"))
    qg, kg, qwg, kwg = (t.detach().clone().requires_grad_() for t in (q, k, qw, kw))
    o = rome.apply_qk_norm(qg, kg, cos, sin, m, qwg, kwg, over="heads", backend="triton")
    gr = [torch.randn_like(x) for x in o]
    first = None
    for t in tiles:
        if t is not None:
            launcher.NORM_GRAD_HEADS_TILE = t
        grads = torch.autograd.grad(o, (qg, kg, qwg, kwg), gr, retain_graph=True)
        if first is None:
            first = grads
        err = {n: ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
               for n, a, b in zip(("dq", "dk", "dqw", "dkw"), grads, first)}
        bwd_us, bdet = kernel_us(lambda: torch.autograd.grad(o, (qg, kg, qwg, kwg), gr, retain_graph=True))
        row = dict(workload=name, tile=t, copy_us=copy_us, fwd_us=fwd_us, fwd_kernels=fdet, bwd_us=bwd_us,
                   bwd_kernels=bdet, grads_vs_first_tile=err)
        out["rows"].append(row)
        print(f"[{label} {name} tile {t}] copy {copy_us:.1f} fwd {fwd_us:.1f} ({100 * copy_us / fwd_us:.0f}% copy) "
              f"bwd {bwd_us:.1f} ({100 * 1.5 * copy_us / bwd_us:.0f}% of 1.5 copies); kernels "
              f"{ {k: round(v[1], 1) for k, v in bdet.items()} }; vs first {err}", file=sys.stderr, flush=True)
print(json.dumps(out, indent=1))
