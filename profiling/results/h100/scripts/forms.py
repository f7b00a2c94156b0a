"""Issue 27 on a GPU: each form of rome's q/k op against a copy of the same q/k bytes, forward and
backward, kernel time, on the workloads of the static model (``profiling.workloads``: q/k, tables,
positions and layouts built as ``make report`` builds them; the forms as ``profiling.variants``
builds them):

- ``tables``: ``rome.apply_qk`` (cos/sin per token), ``dot``: the same with x @ M on the tensor cores,
- ``at``: ``rome.apply_qk_at`` (a cos/sin cache read at the positions),
- ``angles``: ``rome.apply_qk_angles`` (the tables computed in the kernel).

Kernel us: ``ab.kernel_us`` (torch.profiler's CUDA kernel durations, median of 20 calls; only
kernels whose name holds "rome", the copy's all). % copy = copy's us / the form's us, the copy
moving q's and k's bytes once each way (the tables not credited to the op: the op's worst end).
Forms' outputs are checked against the tables form (bitwise for at; max |diff| for angles and dot).
``python3 forms.py [workloads] [forms] [dtypes]`` -> one JSON object; a line per row on stderr.
``DEV=cpu SMALL=1 TRITON_INTERPRET=1`` rehearses it on a CPU (small shapes, no timing).
``ANGLE_FULL_ROWS=0|1`` sets ``rome.launch.ANGLE_FULL_ROWS`` first (the angles' tile, an A/B in two
processes)."""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rome  # noqa: E402
import rome.launch  # noqa: E402
from ab import kernel_us as _kernel_us  # noqa: E402
from profiling.variants import VARIANTS, Setup  # noqa: E402
from profiling.workloads import WORKLOADS, qk, scaled_for_cpu, tables  # noqa: E402

if os.environ.get("ANGLE_FULL_ROWS") is not None:
    rome.launch.ANGLE_FULL_ROWS = os.environ["ANGLE_FULL_ROWS"] == "1"
DEV = os.environ.get("DEV", "cuda")
SMALL = os.environ.get("SMALL")
FORMS = {"tables": "rome.apply_qk", "dot": "rome.apply_qk (dot)", "at": "rome.apply_qk_at",
         "angles": "rome.apply_qk_angles"}


def kernel_us(fn, match=None):
    if DEV != "cuda":
        fn()
        return 0.0, {}
    return _kernel_us(fn, match=match)


def main(names, forms, dtypes):
    dev = torch.device(DEV)
    out = {"device": torch.cuda.get_device_name() if DEV == "cuda" else DEV, "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rome": rome.__file__,
           "angle_full_rows": getattr(rome.launch, "ANGLE_FULL_ROWS", None), "rows": []}
    for name in names:
        for dt_name in dtypes:
            dtype = getattr(torch, dt_name)
            w = WORKLOADS[name].replace(dtype=dtype)
            if SMALL:
                w = scaled_for_cpu(w).replace(seq=min(w.seq, 24), q_heads=2, kv_heads=1, batch=min(w.batch, 2))
                if w.grid is not None:
                    w = w.replace(seq=min(w.seq, w.grid[-1]))
            q, k = qk(w, device=dev)
            t = tables(w, device=dev)
            matrix = rome.rotation_matrix(w.sections, w.mode, dtype=dtype, device=dev)
            setup = Setup(w, w.mode, t.cos, t.sin, t.angles, matrix, "triton", t.positions)
            qo, ko = torch.empty_like(q), torch.empty_like(k)
            copy_us, _ = kernel_us(lambda: (qo.copy_(q), ko.copy_(k)))
            row = {"workload": name, "dtype": dt_name, "q": list(q.shape), "k": list(k.shape),
                   "qk_bytes_moved": 2 * (q.numel() + k.numel()) * q.element_size(), "copy_kernel_us": copy_us,
                   "forms": {}}
            ref = None
            for form in forms:
                run = VARIANTS[FORMS[form]].build(setup)
                t0 = time.perf_counter()
                got = run(q, k)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                r = {"first_call_s": time.perf_counter() - t0}
                if ref is None:
                    ref = got
                    q64 = rome.apply_qk(q.double(), k.double(), t.cos.double(), t.sin.double(), matrix.double(),
                                        backend="torch")
                    r["equals_float64_rounded"] = all(torch.equal(a, b.to(a.dtype)) for a, b in zip(got, q64))
                else:
                    r["bitwise_tables_form"] = all(torch.equal(a, b) for a, b in zip(got, ref))
                    r["max_abs_vs_tables_form"] = max((a.double() - b.double()).abs().max().item()
                                                      for a, b in zip(got, ref))
                fwd_us, fwd_k = kernel_us(lambda: run(q, k), match=lambda s: "rome" in s)
                qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
                outs = run(qg, kg)
                grads = [torch.randn_like(o) for o in outs]
                bwd_us, bwd_k = kernel_us(lambda: torch.autograd.grad(outs, (qg, kg), grads, retain_graph=True),
                                          match=lambda s: "rome" in s)
                r |= {"fwd_kernel_us": fwd_us, "fwd_kernels": fwd_k, "bwd_kernel_us": bwd_us, "bwd_kernels": bwd_k,
                      "fwd_pct_copy": 100 * copy_us / fwd_us if fwd_us else None,
                      "bwd_pct_copy": 100 * copy_us / bwd_us if bwd_us else None}
                row["forms"][form] = r
                print(f"[{name} {dt_name} {form}] copy {copy_us:.1f} us; fwd {fwd_us:.1f} us "
                      f"({r['fwd_pct_copy'] or 0:.0f}%), bwd {bwd_us:.1f} us ({r['bwd_pct_copy'] or 0:.0f}%); "
                      f"first {r['first_call_s']:.1f} s; "
                      f"{ {k2: v for k2, v in r.items() if k2.startswith(('equals', 'bitwise', 'max_abs'))} }",
                      file=sys.stderr, flush=True)
                del outs, grads, qg, kg, got
            out["rows"].append(row)
            del q, k, qo, ko, ref
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0].split(",") if a else ["default", "llama-1d", "wan", "hunyuan-video", "decode"],
         a[1].split(",") if len(a) > 1 else list(FORMS),
         a[2].split(",") if len(a) > 2 else ["bfloat16"])
