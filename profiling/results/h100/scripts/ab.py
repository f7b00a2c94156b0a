"""A/B timing of rome.apply_qk fwd/bwd against a device copy of the same bytes, on a GPU.
The rome imported is whichever PYTHONPATH names (the baseline's tree or the candidate's).
Kernel time: torch.profiler's CUDA kernel durations (median over 20 calls; host overhead
excluded); end-to-end: triton.testing.do_bench median (host overhead included when it exceeds
the kernel). Prints one JSON object."""
import json, os, statistics, sys, time
import torch, triton.testing
import rome
from rome import launch

W = {  # batch, q heads, kv heads, seq, sections, mode, theta, grid, decode
    "default": (1, 24, 24, 28800, (44, 44, 40), "half", 1e4, (20, 36, 40), False),
    "llama-1d": (1, 32, 8, 8192, (128,), "half", 5e5, None, False),
    "wan": (1, 40, 40, 21 * 30 * 52, (44, 42, 42), "interleave", 1e4, (21, 30, 52), False),
    "hunyuan-video": (1, 24, 24, 33 * 34 * 60, (16, 56, 56), "interleave", 256.0, (33, 34, 60), False),
    "decode": (64, 32, 8, 1, (128,), "half", 5e5, None, True),
}


def inputs(name):
    """``name`` is a key of W, optionally ``:fp32`` for float32 q/k (bf16 otherwise), then
    optionally ``:dot`` for the dot product (``rome.launch.product``; the gather otherwise)."""
    name, _, dt = name.partition(":")
    dt = dt.partition(":")[0]
    dtype = {"": torch.bfloat16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dt]
    b, hq, hk, s, sections, mode, theta, grid, decode = W[name]
    dev = "cuda"
    m = rome.rotation_matrix(sections, mode, device=dev, dtype=torch.bfloat16)
    if decode:
        pos = 1000 + 37 * torch.arange(b, device=dev)
        cos, sin = rome.rope_cos_sin(pos[:, None], sections, mode=mode, theta=theta, device=dev)
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]
    else:
        pos = rome.grid_positions(grid, device=dev) if grid else torch.arange(s, device=dev)[:, None]
        cos, sin = rome.rope_cos_sin(pos, sections, mode=mode, theta=theta, device=dev)
    if os.environ.get("AB_TABLES") == "x":  # the tables in x's dtype, as transformers passes them
        cos, sin = cos.to(dtype), sin.to(dtype)
    d = sum(sections)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, hq, s, d, device=dev, generator=g).to(dtype)
    k = torch.randn(b, hk, s, d, device=dev, generator=g).to(dtype)
    return q, k, cos, sin, m


def kernel_us(fn, n=20, match=None):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA
          and (match is None or match(e.name))]
    per = {}
    for e in ev:
        per.setdefault(e.name, []).append(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0))
    total = sum(statistics.median(v) * len(v) / n for v in per.values())  # per call
    return total, {k[:60]: (len(v) / n, statistics.median(v)) for k, v in per.items()}


def main(label, names):
    out = {"label": label, "rome": rome.__file__, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rows": []}
    for name in names:
        q, k, cos, sin, m = inputs(name)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        qo, ko = torch.empty_like(q), torch.empty_like(k)

        def copy():
            qo.copy_(q); ko.copy_(k)

        product = name.split(":")[2] if name.count(":") == 2 else "gather"

        def fwd():
            with launch.product(product):
                return rome.apply_qk(q, k, cos, sin, m, backend="triton")

        t0 = time.perf_counter(); fwd(); torch.cuda.synchronize(); first = time.perf_counter() - t0
        qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
        with launch.product(product):
            outs = rome.apply_qk(qg, kg, cos, sin, m, backend="triton")
        grads = [torch.randn_like(o) for o in outs]

        def bwd():
            with launch.product(product):
                return torch.autograd.grad(outs, (qg, kg), grads, retain_graph=True)

        ref = rome.apply_qk(q.double(), k.double(), cos.double(), sin.double(), m.double(), backend="torch")
        got = fwd()
        ok = all(torch.equal(a, b.to(a.dtype)) for a, b in zip(got, ref))
        maxdiff = max((a.double() - b).abs().max().item() for a, b in zip(got, ref))
        row = {"workload": name, "q": list(q.shape), "k": list(k.shape), "bytes": nbytes, "first_call_s": first,
               "fwd_equals_float64_rounded": ok, "fwd_max_abs_vs_float64": maxdiff}
        for key, fn, match in (("copy", copy, None), ("fwd", fwd, lambda s: "rome" in s), ("bwd", bwd, lambda s: "rome" in s)):
            us, detail = kernel_us(fn, match=match)
            row[f"{key}_kernel_us"] = us
            row[f"{key}_kernels"] = detail
            row[f"{key}_bench_us"] = 1e3 * triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")
        for key in ("fwd", "bwd"):
            row[f"{key}_kernel_pct_copy"] = 100 * row["copy_kernel_us"] / row[f"{key}_kernel_us"] if row[f"{key}_kernel_us"] else None
            row[f"{key}_bench_pct_copy"] = 100 * row["copy_bench_us"] / row[f"{key}_bench_us"]
        out["rows"].append(row)
        print(f"[{label}] {name}: copy {row['copy_kernel_us']:.1f} us; fwd {row['fwd_kernel_us']:.1f} us "
              f"({row['fwd_kernel_pct_copy']:.1f}% copy), bwd {row['bwd_kernel_us']:.1f} us ({row['bwd_kernel_pct_copy']:.1f}%); "
              f"end-to-end fwd {row['fwd_bench_us']:.1f} us, bwd {row['bwd_bench_us']:.1f} us; exact {ok}", file=sys.stderr, flush=True)
    from rome import tuning
    out["tuned"] = tuning.chosen()  # the tile the GPU's autotuner picked for each specialisation
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    import contextlib  # (AB_PARTNER=1: the whole run in launch.partner_form(), no HALVES build;
    # AB_PAIRS=1: inside launch.pairs_halves(), the sections' pairs where the tree has them;
    # AB_NO_NEXT=1: launch.seam_next off, the q -> k seam as before it; AB_PPS=n: launch.PROGRAMS_PER_SM
    # = n, fewer heads a gather program where the T tiles alone make fewer programs than n an SM;
    # AB_TABLES=x: cos and sin in x's dtype)
    if os.environ.get("AB_NO_NEXT") and hasattr(launch, "seam_next"):
        launch.seam_next = lambda *a, **k: False
    if os.environ.get("AB_PPS"):
        launch.PROGRAMS_PER_SM = int(os.environ["AB_PPS"])
        launch.heads_per_program.cache_clear()
    with contextlib.ExitStack() as stack:
        if os.environ.get("AB_PARTNER"):
            stack.enter_context(launch.partner_form())
        if os.environ.get("AB_PAIRS"):
            stack.enter_context(launch.pairs_halves())
        main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else ["default", "llama-1d", "wan", "decode"])
