"""Precision of every variant against the float64 oracle, per dtype, mode and table dtype.

Two errors are kept apart:
- the op's: its output against ``exact(x, cos, sin)`` computed from the tables it was given;
- the tables': ``exact`` with the quantised tables against ``exact`` with float64 tables
  (``table_error`` records, the same for every variant).
``total_max_ulp`` is a variant's output against the float64-table oracle: both together.
"""

from __future__ import annotations

import torch

import rome
from rome.precision import error_stats, ulp_error
from rome.reference import exact

from .variants import Setup, Unavailable, Unsupported
from .workloads import Workload, norm64, norm_weights, qk, tables

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ULP_EDGES = (0.5, 1.0, 2.0, 4.0, 8.0)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def ulp_histogram(ulps: torch.Tensor) -> dict[str, int]:
    """Element counts per ulp-error bin: <=0.5, (0.5,1], (1,2], (2,4], (4,8], >8."""
    u = ulps.flatten().double()
    counts, lo = {}, None
    for hi in ULP_EDGES:
        inside = u <= hi if lo is None else (u > lo) & (u <= hi)
        counts[f"<={hi:g}" if lo is None else f"({lo:g},{hi:g}]"] = int(inside.sum())
        lo = hi
    counts[f">{lo:g}"] = int((u > lo).sum() + u.isnan().sum())
    return counts


def sample_tokens(w: Workload, n: int | None) -> torch.Tensor | None:
    """``n`` token indices spread over the whole sequence (all angles, small and large)."""
    if n is None or w.decode or w.seq <= n:
        return None
    return torch.linspace(0, w.seq - 1, n).round().long().unique()


def _flat(a, b):
    return torch.cat([a.reshape(-1), b.reshape(-1)])


def run_precision(variants, w: Workload, device, *, backend: str, tokens=None, on_step=None):
    """Records for every variant x dtype x mode x table dtype; skips listed with reasons."""
    records, table_records, skipped = [], [], []
    seq = w.seq if tokens is None else len(tokens)
    for dtype in DTYPES:
        q, k = qk(w, dtype=dtype, device=device, seq=seq, seed=1)
        for mode in w.modes:
            t64 = tables(w, mode=mode, dtype=torch.float64, device=device, tokens=tokens)
            true = _flat(exact(q, t64.cos, t64.sin, w.sections, mode), exact(k, t64.cos, t64.sin, w.sections, mode))
            matrix = rome.rotation_matrix(w.sections, mode, dtype=dtype, device=device)
            for table_dtype in dict.fromkeys((torch.float32, dtype)):
                cos, sin = t64.cos.to(table_dtype), t64.sin.to(table_dtype)
                key = {"dtype": dtype_name(dtype), "mode": mode, "table_dtype": dtype_name(table_dtype)}
                (eq, mq), (ek, mk) = (exact(x, cos, sin, w.sections, mode, magnitude=True) for x in (q, k))
                oracle, magnitude = _flat(eq, ek), _flat(mq, mk)
                normed = None  # (oracle, magnitude, true) of norm-then-rotate, for the normed variants
                if w.qk_norm is not None:
                    qw, kw = norm_weights(w, device)
                    nq, nk = norm64(q, qw, w.qk_norm, w.norm_eps), norm64(k, kw, w.qk_norm, w.norm_eps)
                    (nq_, mq_), (nk_, mk_) = (exact(x, cos, sin, w.sections, mode, magnitude=True) for x in (nq, nk))
                    normed = (_flat(nq_, nk_), _flat(mq_, mk_),
                              _flat(exact(nq, t64.cos, t64.sin, w.sections, mode),
                                    exact(nk, t64.cos, t64.sin, w.sections, mode)))
                table_records.append({**key, "max_abs": (oracle - true).abs().max().item(),
                                      "max_ulp": ulp_error(oracle, true, dtype).max().item()})
                setup = Setup(w, mode, cos, sin, t64.angles, matrix, backend, t64.positions)
                for v in variants:
                    if on_step:
                        on_step(f"precision {v.name} {key['dtype']} {mode} tables {key['table_dtype']}")
                    try:
                        run = v.build(setup)
                        q_out, k_out = run(v.prepare(q), v.prepare(k))
                    except (Unsupported, Unavailable) as e:
                        skipped.append({"variant": v.name, **key, "status": type(e).__name__.lower(), "reason": str(e)})
                        continue
                    except Exception as e:  # a broken adapter is reported, not fatal
                        skipped.append({"variant": v.name, **key, "status": "error", "reason": f"{type(e).__name__}: {e}"})
                        continue
                    out = _flat(q_out, k_out)
                    v_oracle, v_magnitude, v_true = normed if v.normed else (oracle, magnitude, true)
                    stats = error_stats(out, v_oracle, v_magnitude, dtype)
                    if v.name.endswith("(native)"):  # the eager chain's rounding, by design not
                        stats["ok"] = None  # within the exact bound: shown beside it, not judged by it
                    ulps = ulp_error(out, v_oracle, dtype)
                    records.append({
                        "variant": v.name, **key,
                        "backend": backend if v.kind == "rome" else v.kind,
                        **stats,
                        "total_max_ulp": ulp_error(out, v_true, dtype).max().item(),
                        "ulp_hist": ulp_histogram(ulps),
                        "elements": out.numel(),
                    })
    return records, table_records, skipped


def angles_accuracy(device, *, backend: str, head_dim: int = 128, theta: float = 500000.0,
                    max_position: int = 2**20, samples: int = 2048) -> dict:
    """How near float64 the tables are that the op applies, for positions up to ``max_position``
    (Llama-3's frequencies): the kernel's own angles (``apply_qk_angles``), the float64-derived
    fp32 cache rows (``cos_sin_for_positions``, bitwise the rows ``apply_qk_at`` reads; applied
    with ``apply_qk``) and fp32 angles (what transformers and diffusers build).

    Measured through the ops: q = [1, .., 1, 0, .., 0] (half mode) makes the output column j the
    table's cos_j and column j + D/2 its sin_j, rounded once to fp32. Positions: the first and
    last ``samples`` and ``samples`` random ones in between."""
    from rome.layouts import cos_sin_for_positions, rope_layout
    from rome.positions import angle_frequencies

    g = torch.Generator().manual_seed(0)
    pos = torch.cat([torch.arange(samples), torch.randint(0, max_position, (samples,), generator=g),
                     torch.arange(max_position - samples, max_position)])
    layout = rope_layout(rome.rope_frequencies(head_dim, theta=theta), mode="half")
    inv = layout.inv_freq.double()[: head_dim // 2]
    angles = pos.double()[:, None] * inv
    true = torch.cat([angles.cos(), angles.sin()], -1)
    half = head_dim // 2
    q = torch.cat([torch.ones(half), torch.zeros(half)]).expand(1, 1, len(pos), head_dim).to(device)
    m = layout.matrix(device=device)
    p = pos[:, None].to(device)
    freqs, scales = (t.to(device) for t in angle_frequencies(layout.inv_freq, layout.attention_scaling))
    kernel, _ = rome.apply_qk_angles(q, q, freqs, scales, m, p, backend=backend)
    cos_c, sin_c = cos_sin_for_positions(layout, pos.to(device))
    cached, _ = rome.apply_qk(q, q, cos_c, sin_c, m, backend=backend)
    fp32 = pos.float()[:, None] * inv.float()
    fp32_tables = torch.cat([fp32.cos(), fp32.sin()], -1)

    def err(t):
        return (t.reshape(len(pos), head_dim).double().cpu() - true).abs().max().item()

    return {"head_dim": head_dim, "theta": theta, "max_position": max_position, "positions": len(pos),
            "backend": backend, "kernel_angles_max_abs": err(kernel), "fp32_cache_max_abs": err(cached),
            "fp32_angles_max_abs": err(fp32_tables)}
