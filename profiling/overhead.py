"""``python -m profiling overhead``: host microseconds per call of rome's entry points.

What a call costs on the host, apart from the kernel: ``rome.apply_qk``, ``rome.apply_qk_at`` and
``rome.RoPE``'s forward, forward alone (``no_grad``) and forward+backward, for a decode step
(Llama: B=64, 32 q / 8 kv heads, D=128, S=1, bf16) and a prefill (B=1, S=1024), beside the
model's own eager ``rotate_half`` chain (transformers' ``apply_rotary_pos_emb``) and its
``torch.compile``'d version.

Method. Without a GPU the kernel's launches are recorded instead of run (``rome.launcher.capture``,
planned as for a GPU: the workers run without ``TRITON_INTERPRET``) and the time spent recording
them (``launcher._record``, or ``_run`` in trees that have no ``_record``) is measured inside every
call and subtracted. The eager chain runs for real on one row (``[1, 1, 1, D]``: its arithmetic is
negligible, so what is timed is its dispatch). Each measurement is ``time.perf_counter`` around
``CALLS`` calls after a warm-up, repeated ``REPEATS`` times interleaved with the others; the
median per call is reported, with the Python function calls one call makes (``sys.setprofile``,
the recording's own left out). On a GPU the launches are real (``--real``), q and k full size, and
the chain runs at full size too; host time is the loop's wall time over its calls (one sync at the
end), plus the device time of a CUDA-graph replay of the decode step.

``--baseline DIR``: also measure the rome of another checkout (e.g. ``git worktree add /tmp/old
a5e13a7``) in the same run: workers for this tree and for DIR run alternately, ``--rounds`` times,
and the medians over rounds are reported side by side.

Results: ``overhead.json`` and ``overhead.md`` in ``--out`` (default ``reports/overhead-<time>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CALLS = 200
REPEATS = 7
COMPILE = True  # the torch.compile'd chain too (--no-compile: not, e.g. in a quick test)
ROOT = Path(__file__).resolve().parent.parent

SHAPES = {
    # name: (B, Nq, Nk, S, D)
    "decode": (64, 32, 8, 1, 128),
    "prefill": (1, 32, 8, 1024, 128),
}


# --- the worker: one process, one rome --------------------------------------------------------


def _chain():
    import torch

    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # transformers' Llama
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        q_embed = (q * cos) + (rotate_half(q) * sin)
        k_embed = (k * cos) + (rotate_half(k) * sin)
        return q_embed, k_embed

    return apply_rotary_pos_emb


class _Timer:
    """Time spent in the launcher's recording, summed (subtracted from each call). The recorded
    launch is dropped at once (inside the subtracted time): kept, it would keep the call's outputs
    alive, and every later call would allocate fresh memory, which no real launch does."""

    def __init__(self):
        self.spent = 0.0

    def wrap(self, fn):
        from rome import launcher

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                captured = launcher._capture.get()
                if captured is not None:
                    captured.launches.clear()
                self.spent += time.perf_counter() - t

        timed.__wrapped__ = fn
        return timed


def _calls(fn, skip) -> int:
    """Python function calls one ``fn()`` makes, those under ``skip`` (the recording) left out."""
    count = [0]
    depth = [0]

    def prof(frame, event, arg):
        if event == "call":
            if frame.f_code is skip:
                depth[0] += 1
            elif depth[0] == 0:
                count[0] += 1
        elif event == "return" and frame.f_code is skip:
            depth[0] -= 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0] - 1  # fn itself (the lambda)


def _cases(real: bool, device: str, shapes):
    """(name, shape, pass, fn) of every measurement; fn() makes one call."""
    out = []
    for shape_name in shapes:
        out += _shape_cases(shape_name, real, device)
    return out


def _shape_cases(shape_name, real, device):
    """The cases of one shape (a function: each lambda binds this shape's tensors)."""
    import torch

    import rome
    from rome import launcher

    chain = _chain()
    out = []
    dtype = torch.bfloat16
    backend = "triton"
    b, nq, nk, s, d = SHAPES[shape_name]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, nq, s, d, generator=gen).to(device, dtype)
    k = torch.randn(b, nk, s, d, generator=gen).to(device, dtype)
    layout = rome.rope_layout(rome.rope_frequencies(d, theta=500000.0), mode="half")
    rope = rome.RoPE(layout, backend=backend)
    m = rope.matrix(dtype, torch.device(device))
    p = 4096
    cache_c, cache_s = rome.cos_sin_cache(layout, p, dtype=torch.float32, device=device)
    if s == 1:  # decode: each sequence at its own position
        ids = (1000 + 37 * torch.arange(b)).to(device)[:, None]  # [B, 1]
    else:
        ids = torch.arange(s, device=device)[None]  # [1, S]
    pos = ids[:, None, :, None]  # [B', 1, S, 1]
    rows_c = cache_c[ids]  # [B', S, D]
    rows_s = cache_s[ids]
    cos = rows_c[:, None] if b > 1 else rows_c[0]  # [B, 1, 1, D] decode, [S, D] prefill
    sin = rows_s[:, None] if b > 1 else rows_s[0]
    with launcher.capture() if not real else _null():
        rope(q, k, ids)  # the shared cache built, the positions' span remembered
    # the chain: one row on the CPU (its dispatch), full size on a GPU
    if real:
        cq, ck, cc, cs = q, k, rows_c.to(dtype), rows_s.to(dtype)
    else:
        cq, ck = q[:1, :1, :1].clone(), k[:1, :1, :1].clone()
        cc, cs = rows_c[:1, :1].to(dtype), rows_s[:1, :1].to(dtype)
    entries = [
        ("rome.apply_qk", lambda q, k: rome.apply_qk(q, k, cos, sin, m, backend=backend), (q, k)),
        ("rome.apply_qk_at", lambda q, k: rome.apply_qk_at(q, k, cache_c, cache_s, m, pos, backend=backend),
         (q, k)),
        ("rome.RoPE", lambda q, k: rope(q, k, ids), (q, k)),
        ("eager chain", lambda q, k: chain(q, k, cc, cs), (cq, ck)),
    ]
    compiled = _compiled(chain) if COMPILE else None
    if compiled is not None:
        entries.append((f"torch.compile chain ({compiled[1]})", lambda q, k: compiled[0](q, k, cc, cs),
                        (cq, ck)))
    for name, f, (a, c) in entries:
        out.append((name, shape_name, "fwd", _forward(f, a, c)))
        out.append((name, shape_name, "fwd+bwd", _forward_backward(f, a, c)))
    return out


def _forward(f, q, k):
    import torch

    def run():
        with torch.no_grad():
            return f(q, k)

    return run


def _forward_backward(f, q, k):
    import torch

    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    gq, gk = torch.ones_like(q), torch.ones_like(k)

    def run():  # (autograd.grad: no accumulation into q.grad, whose copy is no host overhead of rome's)
        with torch.enable_grad():
            a, b = f(q, k)
        torch.autograd.grad((a, b), (q, k), (gq, gk))

    return run


_COMPILED = {}


def _compiled(chain):
    """The chain under torch.compile (inductor; where it cannot compile here, aot_eager), or None."""
    if "fn" in _COMPILED:
        return _COMPILED["fn"]
    import torch

    result = None
    for backend in ("inductor", "aot_eager"):
        try:
            fn = torch.compile(chain, backend=backend, dynamic=False)
            import torch as _t

            x = _t.randn(1, 1, 1, 8)
            c = _t.randn(1, 1, 8)
            fn(x, x, c, c)
            result = (fn, backend)
            break
        except Exception as e:  # noqa: BLE001 - a backend that cannot run here: the next one
            print(f"overhead: torch.compile backend={backend} failed here: {type(e).__name__}: {e}",
                  file=sys.stderr)
    _COMPILED["fn"] = result
    return result


def worker(real: bool, device: str, shapes, calls: int, repeats: int) -> dict:
    """Measure every case in this process; a dict of results."""
    import torch

    import rome
    from rome import launcher

    timer = _Timer()
    name = "_record" if hasattr(launcher, "_record") else "_run"
    original = getattr(launcher, name)
    skip = original.__code__
    setattr(launcher, name, timer.wrap(original))
    cases = _cases(real, device, shapes)
    results = {}
    capture = launcher.capture if not real else None

    def block():
        return capture() if capture is not None else _null()

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for label, shape, pass_, fn in cases:  # warm-up (compiles, autotunes, fills every cache)
        with block():
            for _ in range(20):
                fn()
        sync()
    samples = {(label, shape, pass_): [] for label, shape, pass_, _ in cases}
    for _ in range(repeats):
        for label, shape, pass_, fn in cases:
            with block() as launches:
                timer.spent = 0.0
                sync()
                t = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                total = time.perf_counter() - t
                if launches is not None:
                    launches.clear()
            samples[(label, shape, pass_)].append((total - timer.spent) / calls * 1e6)
    for label, shape, pass_, fn in cases:
        with block():
            n = _calls(fn, skip)
        results[f"{label}|{shape}|{pass_}"] = dict(
            entry=label, shape=shape, pass_=pass_, median_us=statistics.median(samples[(label, shape, pass_)]),
            min_us=min(samples[(label, shape, pass_)]), python_calls=n)
    if real:
        results.update(_graph_replay(device))
    return dict(rome=str(Path(rome.__file__).resolve().parent.parent), torch=torch.__version__,
                device=torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                recorded=not real, results=results)


def _graph_replay(device) -> dict:
    """Device µs of a CUDA-graph replay of the decode step's ``apply_qk_at`` (GPU only)."""
    import torch

    import rome

    b, nq, nk, s, d = SHAPES["decode"]
    dtype = torch.bfloat16
    q = torch.randn(b, nq, s, d, device=device, dtype=dtype)
    k = torch.randn(b, nk, s, d, device=device, dtype=dtype)
    layout = rome.rope_layout(rome.rope_frequencies(d, theta=500000.0), mode="half")
    m = layout.matrix(dtype, torch.device(device))
    c, sn = rome.cos_sin_cache(layout, 4096, dtype=torch.float32, device=device)
    pos = (1000 + 37 * torch.arange(b, device=device))[:, None, None, None]
    out = {}
    rows_c, rows_s = c[pos[:, 0, :, 0]].to(dtype), sn[pos[:, 0, :, 0]].to(dtype)
    chain = _chain()
    for name, f in (("rome.apply_qk_at", lambda: rome.apply_qk_at(q, k, c, sn, m, pos, backend="triton")),
                    ("eager chain", lambda: chain(q, k, rows_c, rows_s))):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                f()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            f()
        graph.replay()
        torch.cuda.synchronize()
        n = 200
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        out[f"{name}|decode|graph replay"] = dict(entry=name, shape="decode", pass_="graph replay",
                                                  median_us=start.elapsed_time(end) / n * 1e3,
                                                  min_us=None, python_calls=None)
    return out


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


# --- the driver -------------------------------------------------------------------------------


def _run_worker(tree: Path, real: bool, device: str, shapes, calls: int, repeats: int, compile_=True) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # plan launches as for a GPU (recorded on the CPU)
    env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--device", device,
           "--shapes", ",".join(shapes), "--calls", str(calls), "--repeats", str(repeats)]
    if real:
        cmd.append("--real")
    if not compile_:
        cmd.append("--no-compile")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(tree))
    if done.returncode != 0:
        raise RuntimeError(f"overhead worker for {tree} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _merge(rounds: list[dict]) -> dict:
    """Median over rounds of each result's median."""
    out = dict(rounds[0])
    out["results"] = {}
    for key, r in rounds[0]["results"].items():
        values = [x["results"][key]["median_us"] for x in rounds if key in x["results"]]
        out["results"][key] = dict(r, median_us=statistics.median(values), rounds_us=values)
    return out


def _best(x: dict) -> float:
    """The best round's median (the least disturbed by other load on the machine)."""
    return min(x.get("rounds_us") or [x["median_us"]])


def _table(trees: dict[str, dict]) -> str:
    names = list(trees)
    first = trees[names[0]]["results"]
    head = "| entry point | shape | pass | " + " | ".join(
        f"{n}: µs/call, median (best round) [Python calls]" for n in names)
    if len(names) == 2:
        head += " | before / after (median, best)"
    lines = [head + " |", "|" + "---|" * (head.count("|") - 1 + 1)]
    for key, r in first.items():
        cells = []
        for n in names:
            x = trees[n]["results"].get(key)
            calls = "" if x is None or x["python_calls"] is None else f" [{x['python_calls']}]"
            cells.append("—" if x is None else f"{x['median_us']:.1f} ({_best(x):.1f}){calls}")
        row = f"| {r['entry']} | {r['shape']} | {r['pass_']} | " + " | ".join(cells)
        if len(names) == 2:
            a, b = (trees[n]["results"].get(key) for n in names)
            row += (f" | {a['median_us'] / b['median_us']:.2f}×, {_best(a) / _best(b):.2f}×"
                    if a and b and b["median_us"] else " | —")
        lines.append(row + " |")
    return "\n".join(lines)


def _ratios(result: dict) -> list[str]:
    """The rome entry points against the eager chain of the same shape and pass, in one tree's
    workers (measured side by side, interleaved)."""
    res = result["results"]
    lines = []
    for key, r in res.items():
        if not r["entry"].startswith("rome."):
            continue
        chain = res.get(f"eager chain|{r['shape']}|{r['pass_']}")
        if chain:
            lines.append(f"- {r['entry']} {r['shape']} {r['pass_']}: {r['median_us']:.1f} µs, "
                         f"{r['median_us'] / chain['median_us']:.2f}× the eager chain ({chain['median_us']:.1f} µs); "
                         f"best rounds {_best(r):.1f} against {_best(chain):.1f} µs")
    return lines


def render(report: dict) -> str:
    """The markdown of an ``overhead.json`` report."""
    merged, names = report["measured"], list(report["measured"])
    device_name = merged[names[-1]]["device"]
    load = report.get("load")
    md = [f"# Host overhead per call ({device_name})", "",
          f"Method: {report['method']}. Median over {report['rounds']} round(s) of the median of "
          f"{report['repeats']} repeats of {report['calls']} calls, the trees' workers alternating; in "
          "parentheses the best round's median; in brackets the Python function calls of one call "
          "(sys.setprofile).", ""]
    if load:
        md += [f"Load average (1 min) at the start and the end: {load[0]:.2f} and {load[1]:.2f} "
               f"on {report.get('cpus', '?')} CPUs (other processes share the machine: compare within a "
               "row and against the eager chain of the same tree, not across runs).", ""]
    md += [_table(merged), ""]
    for n in names:
        md += [f"Against the eager chain ({n}):", "", *_ratios(merged[n]), ""]
    return "\n".join(md)


def main(args) -> dict:
    if args.render:
        report = json.loads(Path(args.render).read_text())
        text = render(report)
        Path(args.render).with_suffix(".md").write_text(text)
        print(text)
        return report
    real = args.real if args.real is not None else _has_cuda()
    device = args.device or ("cuda" if real else "cpu")
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    trees = {"this tree": ROOT}
    if args.baseline:
        base = Path(args.baseline).resolve()
        if not (base / "rome" / "__init__.py").is_file():
            raise SystemExit(f"--baseline {args.baseline}: not a checkout of rome (no rome/__init__.py there)")
        trees = {"before": base, "after": ROOT}
    out = Path(args.out or f"reports/overhead-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    rounds: dict[str, list] = {n: [] for n in trees}
    for i in range(args.rounds):
        for name, tree in trees.items():
            print(f"overhead: round {i + 1}/{args.rounds}, {name} ({tree})", file=sys.stderr, flush=True)
            rounds[name].append(_run_worker(tree, real, device, shapes, args.calls, args.repeats, args.compile))
    load.append(os.getloadavg()[0])
    merged = {n: _merge(r) for n, r in rounds.items()}
    method = ("launches recorded with rome.launcher.capture (planned as for a GPU), the recording's own "
              "time subtracted; the eager chain on one row" if not real else
              "real launches; host time = loop wall time / calls, one sync at the end")
    report = dict(method=method, calls=args.calls, repeats=args.repeats, rounds=args.rounds, load=load,
                  cpus=os.cpu_count(), trees={n: str(t) for n, t in trees.items()}, measured=merged)
    (out / "overhead.json").write_text(json.dumps(report, indent=2))
    text = render(report)
    (out / "overhead.md").write_text(text)
    print(text)
    print(f"overhead: wrote {out / 'overhead.json'} and {out / 'overhead.md'}", file=sys.stderr)
    return report


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="output folder (default reports/overhead-<timestamp>/)")
    p.add_argument("--baseline", help="another checkout's root, measured alternately with this tree")
    p.add_argument("--rounds", type=int, default=1, help="rounds of (baseline, this tree) workers (default 1)")
    p.add_argument("--calls", type=int, default=CALLS)
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--shapes", help=f"comma-separated, of {sorted(SHAPES)} (default all)")
    p.add_argument("--device", help="cpu or cuda (default cuda where available)")
    p.add_argument("--real", action=argparse.BooleanOptionalAction, default=None,
                   help="run the launches (default: on a GPU); --no-real records them")
    p.add_argument("--render", help="write the markdown of an existing overhead.json beside it, measuring nothing")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the torch.compile'd chain (default; --no-compile skips it)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--worker", action="store_true")
    a = parser.parse_args()
    if a.worker:
        COMPILE = a.compile
        res = worker(bool(a.real), a.device or "cpu", a.shapes.split(","), a.calls, a.repeats)
        print(json.dumps(res))
    else:
        main(a)
