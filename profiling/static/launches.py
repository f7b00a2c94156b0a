"""One workload's launches (``python -m profiling kernels --workload NAME``; the report's kernels
section): every launch the workload's rome variants make, forward and backward, as
``rome.launcher.capture`` records them, compiled for an arch with the bandwidth model each;
Liger-Kernel's rope kernel beside them where it is importable."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from pathlib import Path

from .archs import ARCHS, Arch
from .compile import Job, compile_all, compiler_pool, default_jobs, environment, json_safe, slug
from .model import GPU_NOTES, GPUS, MODEL_METHOD, bandwidth_model, tile_elements


def rome_variants() -> tuple[str, ...]:
    """The report's rome variants (``profiling.variants``, kind "rome"), in its order."""
    return tuple(v.name for v in _variants().values() if v.kind == "rome")


WORKLOAD_ARCH = 90
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _workload(name: str, overrides: dict | None = None):
    """The workload ``name`` with ``overrides`` (batch, q_heads, kv_heads, seq; dtype as "bf16")."""
    import torch

    from ..workloads import WORKLOADS

    w = WORKLOADS[name]
    changes = dict(overrides or {})
    if "dtype" in changes:
        changes["dtype"] = getattr(torch, DTYPES.get(changes["dtype"], changes["dtype"]))
    return w.replace(**changes) if changes else w


def _setup(w):
    import rome

    from ..variants import Setup
    from ..workloads import tables

    t = tables(w)
    matrix = rome.rotation_matrix(w.sections, w.mode, dtype=w.dtype)
    return Setup(w, w.mode, t.cos, t.sin, t.angles, matrix, "triton", t.positions)


def _launch_dict(variant: str, kernel_config, cc: int, **fields) -> dict:
    return {"variant": variant, "config": kernel_config.name, "meta": dict(kernel_config.meta),
            "num_warps": kernel_config.num_warps, "num_stages": kernel_config.num_stages,
            "job": Job.of(kernel_config, cc), **fields}


def _captured(w, setup, variant, cc: int, num_sms: int) -> list[dict]:
    """The launches ``variant`` makes on ``w`` (forward, then backward) as ``rome.launcher.capture``
    records them: real shapes, CPU tensors, nothing run."""
    import torch

    from rome import launcher

    v = _variants()[variant]
    run = v.build(setup)
    q = torch.empty(w.shape(w.q_heads), dtype=w.dtype).requires_grad_()
    k = torch.empty(w.shape(w.kv_heads), dtype=w.dtype).requires_grad_()
    with launcher.capture(num_sms=num_sms) as launches:
        outs = run(v.prepare(q), v.prepare(k))
        torch.autograd.backward(outs, [torch.empty_like(o) for o in outs])
    return [_launch_dict(variant, L.kernel_config, cc, **{"pass": "backward" if L.transpose else "forward"},
                         grid=L.grid, units=L.units, elements=L.elements, programs=launch_programs(L))
            for L in launches]


def launch_programs(L) -> dict:
    """What the schedule needs of a captured launch's programs: ``kinds`` [(count, work[, loop trips])] in
    dispatch order (work: the x elements a program stores through each of its tile loops, in the
    order it reaches them; None: each tile loop once), ``grid``, ``uniform`` {pointer: value} of
    the scalars the kernel reads at one address for every program.

    rome's gather kernel (``_rome_gather_kernel``, this tree's and older ones with the same
    arguments): grid (T tiles of BLOCK_R rows, head groups of HB heads); a program's heads
    [g*HB, +HB) of q's a_H heads then k's b_H (with ``KG`` > 0: q's groups [0, KG), then k's, a
    group of k's heads walking them in q's place), so its work is q's heads then k's, BLOCK_R x D
    elements each; the permutation's class at ``src[D]`` (where the launch stores one); with the
    norm over a token's heads (``NORM`` 3) each kind's loop trips (``Programs``): the token tile's
    (``HEADS_B``: grid (programs, tensors), program (p, t) walks tensor t's tokens p, p + P, ...,
    two a loop iteration) or the head groups' sweeps. Any other
    kernel: every program alike, one pass through the kernel, its persistent loop (units over
    programs) as one loop's work."""
    fn = L.kernel_config.fn
    names = [p.name for p in fn.params if not p.is_constexpr]
    args = dict(zip(names, L.args))
    block_r = (L.consts or {}).get("BLOCK_R") or getattr(L.config, "block_r", None)
    if getattr(fn, "__name__", "") == "_rome_gather_kernel" and {"HB", "a_H", "b_H", "n_t", "D"} <= set(args):
        hb, qa, kb, d = int(args["HB"]), int(args["a_H"]), int(args["b_H"]), int(args["D"])
        tiles = -(-int(args["n_t"]) // block_r)
        consts = L.consts or {}
        uniform = {}
        src = args.get("src_ptr")
        if src is not None and hasattr(src, "numel") and src.numel() > d:
            uniform["src_ptr"] = int(src.reshape(-1)[d])
        if consts.get("HEADS_B"):  # the token tile: programs (p, 0) walk q's tiles p, p + P, ..., (p, 1)
            # k's, two tiles an iteration, an odd count's last after the loop (the tail: on the
            # walk's fall-through, so walked whatever the count: an even count's program is
            # modelled one token longer, the pessimistic side); each tile BLOCK_R tokens x the
            # tensor's heads; one tile loop, its trips given
            tensors = 1 + (kb > 0)
            progs = L.grid // tensors
            few, extra = divmod(tiles, progs)  # (a program's tiles: few, or few + 1 for the first extra)
            kinds = [[count, [n * block_r * heads * d], [max(1, n // 2)]]
                     for heads in (qa, kb)[:tensors] for count, n in ((extra, few + 1), (progs - extra, few)) if count]
            return {"kinds": kinds, "grid": L.grid, "uniform": uniform}
        heads_norm = consts.get("NORM") == 3  # kernel.NORM_RMS_HEADS: the norm over a token's heads
        # heads an iteration of that norm's sweeps: the launched kernel's (1 before it had them)
        source = getattr(getattr(fn, "fn", None), "__globals__", {})
        sweep = getattr(source.get("SWEEP"), "value", 1)
        sweep_grad = getattr(source.get("SWEEP_GRAD"), "value", 1)
        kinds = []
        kg = int(args.get("KG", 0))  # (groups of q's heads, then k's; 0: each group over both)
        # (SEAM builds: a program's heads apart from the other tensor's, the loop's last batch
        # peeled: DEPTH heads a batch, the dot's too; one for a permutation breaking pairs)
        apart = bool(consts.get("SEAM"))
        none = getattr(source.get("PAIRS_NONE"), "value", 0)
        batch = 1 if not consts.get("DOT") and uniform.get("src_ptr") == none else int(consts.get("DEPTH", 1))
        bounds = ([(g * hb, min(g * hb + hb, qa)) for g in range(kg)]
                  + [(qa + g * hb, min(qa + g * hb + hb, qa + kb)) for g in range(-(-kb // hb))]) if kg \
            else [(g * hb, min(g * hb + hb, qa + kb)) for g in range(-(-(qa + kb) // hb))]
        for lo, hi in bounds:
            q = max(0, min(hi, qa) - min(lo, qa))
            k = max(0, hi - max(lo, qa))
            if kg and k:  # (a group of k's heads walks them in q's place: the first loop)
                q, k = k, 0
            tail = None
            if apart:  # (the last batch after the loop, the loop the others)
                looped = max(0, -(-q // batch) - 1) * batch
                q, tail = looped, (q - looped) * block_r * d
            kind = [tiles, [q * block_r * d, k * block_r * d]]
            if heads_norm:  # each tensor's first sweep over its heads, then its tile loop:
                # forward SWEEP heads a sweep iteration, the tile loop's from the work (K heads an
                # iteration); backward SWEEP_GRAD heads a sweep iteration, then a head an iteration
                # (the tile loop stores dx and the head's dw partial sums)
                if consts.get("TRANSPOSE"):
                    kind.append([-(-q // sweep_grad), q, -(-k // sweep_grad), k])
                else:
                    kind.append([-(-q // sweep), None, -(-k // sweep), None])
            if tail is not None:
                kind += [None, tail] if len(kind) == 2 else [tail]
            kinds.append(kind)
        return {"kinds": kinds, "grid": L.grid, "uniform": uniform}
    per_program = L.elements / L.grid if L.units > L.grid else None
    return {"kinds": [[L.grid, None if per_program is None else [per_program]]], "grid": L.grid, "uniform": {}}


def _torch():
    import torch

    return torch


def _variants():
    from ..variants import VARIANTS

    return VARIANTS


def _liger(w, cc: int) -> dict:
    """``_liger_launches``, or where the installed Liger-Kernel cannot be modelled (a signature
    this model does not know, a failure to build its launch) a status saying why: a row of the
    table, never the end of it."""
    try:
        return _liger_launches(w, cc)
    except Exception as e:
        return {"status": "not modelled", "reason": f"{type(e).__name__}: {e}"[:2000],
                "version": _liger_version()}


def _liger_version():
    try:
        from importlib.metadata import version

        return version("liger-kernel")
    except Exception:
        return None


def _liger_launches(w, cc: int) -> dict:
    """Liger-Kernel's rope kernel (``liger_kernel.ops.rope._triton_rope``) compiled as
    ``liger_rotary_pos_emb`` launches it on the closest shape it can express: a 1D half rotation of
    the whole head (it has neither sections nor interleave), q and k BSND, tables in q's dtype
    ``[1, S, D]``; one program per token, no loop (the tile: the whole kernel, every head of one
    token)."""
    try:
        from liger_kernel.ops import rope as liger_rope
    except ImportError as e:
        return {"status": "not installed", "reason": f"liger-kernel is not importable here ({e})"}
    import triton

    fn = liger_rope._triton_rope
    pow2 = triton.next_power_of_2
    hd, nq, nk = w.head_dim, w.q_heads, w.kv_heads
    # the whole head rotated: rd (0.8.5's rotary dims) = hd
    values = {"bs": w.batch, "cos_bs": 1, "n_qh": nq, "n_kh": nk, "hd": hd, "rd": hd, "pad_n_qh": pow2(nq),
              "pad_n_kh": pow2(nk), "pad_hd": pow2(hd), "pad_rd": pow2(hd), "BLOCK_SIZE": max(pow2(nq), pow2(nk))}
    unknown = [p.name for p in fn.params if p.is_constexpr and p.name != "BACKWARD_PASS" and p.name not in values]
    if unknown:
        return {"status": "not modelled", "version": _liger_version(),
                "reason": f"liger_kernel.ops.rope._triton_rope has constexprs this model does not know: {unknown}"}
    xt = {2: "*bf16" if w.dtype == _torch().bfloat16 else "*fp16", 4: "*fp32"}[w.dtype.itemsize]
    out = []
    for backward in (False, True):
        constexprs, signature = {}, {}
        for p in fn.params:
            if p.is_constexpr:
                constexprs[p.name] = backward if p.name == "BACKWARD_PASS" else values[p.name]
            elif p.name in ("q_ptr", "k_ptr", "cos", "sin"):
                signature[p.name] = xt
            else:
                signature[p.name] = "i32"
        divisible = tuple(n for n in signature if n != "sl" and (n in ("q_ptr", "k_ptr", "cos", "sin")
                                                                  or hd % 16 == 0))
        cfg = _LigerConfig(f"liger rope {'bwd' if backward else 'fwd'} D={hd} heads={nq}/{nk}", fn, signature,
                           constexprs, divisible, 4, 3, {}, {})
        xb = w.dtype.itemsize
        elements = w.batch * w.seq * (nq + nk) * hd
        tables = 2 * w.seq * hd * xb / elements
        meta = {"x_dtype": {2: "bf16", 4: "fp32"}[xb], "head_dim": hd, "elements_per_tile": (nq + nk) * hd,
                "dram_bytes_per_element": 2 * xb + tables, "dram_read_bytes_per_element": xb + tables}
        out.append({"variant": "liger-kernel", "config": cfg.name, "meta": meta, "num_warps": 4, "num_stages": 3,
                    "job": Job.of(cfg, cc), "pass": "backward" if backward else "forward",
                    "grid": w.batch * w.seq, "units": w.batch * w.seq, "elements": elements,
                    "programs": {"kinds": [[w.batch * w.seq, None]], "grid": w.batch * w.seq, "uniform": {}},
                    "closest": "1D half rotation of the whole head, tables in q's dtype"})
    return {"status": "ok", "launches": out, "version": _liger_version()}


@dataclasses.dataclass(frozen=True)
class _LigerConfig:
    name: str
    fn: object
    signature: dict
    constexprs: dict
    divisible_by_16: tuple
    num_warps: int
    num_stages: int
    meta: dict
    options: dict


def workload_launches(name: str, overrides: dict | None = None, *, cc: int = WORKLOAD_ARCH,
                      num_sms: int = 132, variants: tuple[str, ...] | None = None, liger: bool = True) -> dict:
    """In a worker (no TRITON_INTERPRET=1): every launch the workload's rome variants make (or
    those of ``variants``), forward and backward, as picklable dicts with their compile jobs;
    Liger-Kernel's beside them where importable (and ``liger``). ``rome.launcher.capture`` records
    them (the launch's own specialisation, grid and work units, with the bytes an element must
    move in its meta)."""
    from ..variants import Unavailable, Unsupported

    known = rome_variants()
    unknown = [v for v in variants or () if v not in known]
    if unknown:
        raise ValueError(f"variants: {unknown} are not rome variants ({', '.join(known)})")
    w = _workload(name, overrides)
    setup = _setup(w)
    how = "rome.launcher.capture"
    launches, skipped = [], []
    for variant in known if variants is None else variants:
        try:
            launches += _captured(w, setup, variant, cc, num_sms)
        except (Unsupported, Unavailable) as e:
            skipped.append({"variant": variant, "reason": f"{type(e).__name__}: {e}"})
        except Exception as e:  # one variant that cannot be captured is a line, not the end
            skipped.append({"variant": variant, "reason": f"{type(e).__name__}: {e}"[:2000]})
    workload = {"name": w.name, "q_shape": list(w.shape(w.q_heads)), "k_shape": list(w.shape(w.kv_heads)),
                "dtype": str(w.dtype).removeprefix("torch."), "sections": list(w.sections), "mode": w.mode}
    return {"workload": workload, "capture": how, "num_sms": num_sms, "launches": launches, "skipped": skipped,
            "liger": _liger(w, cc) if liger else {"status": "not asked for"}}


def launch_row(launch: dict, arch: Arch, res: dict) -> dict:
    """One ``kernels.json`` launch: the contract's fields (variant, pass, arch, config, cubin,
    registers, spill_bytes, estimate_h100, estimate_h200) and the model's other figures."""
    r = {"variant": launch["variant"], "pass": launch["pass"], "arch": arch.name, "config": launch["config"],
         "cubin": None, "registers": None, "spill_bytes": None, "estimate_h100": None, "estimate_h200": None,
         "grid": launch.get("grid"), "units": launch.get("units"), "elements": launch.get("elements"),
         "num_warps": launch["num_warps"], "num_stages": launch["num_stages"], "meta": launch["meta"]}
    if launch.get("closest"):
        r["closest"] = launch["closest"]
    if "error" in res:
        return r | {"ok": False, "error": res["error"]}
    rs = res["res"]
    smem = res["shared_dynamic"] + rs["shared"]
    elements, dram, read = tile_elements(launch["meta"])
    xb = {"bf16": 2, "fp16": 2, "fp32": 4}.get(launch["meta"].get("x_dtype"), 2)
    try:
        model = bandwidth_model(res["sass"], num_warps=res["num_warps"], elements_per_tile=elements,
                                dram_bytes_per_element=dram, dram_read_bytes_per_element=read,
                                registers=rs["reg"], shared_bytes=smem, arch=arch,
                                grid=launch.get("grid"), units=launch.get("units"), elements=launch.get("elements"),
                                programs=launch.get("programs"), params=res.get("params"), x_bytes=xb)
    except Exception as e:  # a launch the model cannot read is a row saying why, not the end of the table
        return r | {"ok": False, "error": f"model failed: {type(e).__name__}: {e}"[:2000]}
    local = res["sass_stats"]["whole"]["local"]
    return r | {"ok": True, "error": None, "cubin": res["cache_cubin"], "registers": rs["reg"],
                "spill_bytes": rs["stack"], "local_instructions": local, "spills": rs["stack"] > 0 or local > 0,
                "shared_bytes": smem, "triton_hash": res["triton_hash"], **model}


def _write_files(out: Path, rows: list[dict], files: list) -> None:
    """Each build's cubin and SASS under ``out/<arch>/`` (identical builds once)."""
    written = {}
    for r, (cubin, sass) in zip(rows, files):
        if cubin is None:
            continue
        key = (r["arch"], r["triton_hash"])
        if key not in written:
            stem = Path(r["arch"]) / slug(f"{r['variant']} {r['config']}")
            (Path(out) / r["arch"]).mkdir(parents=True, exist_ok=True)
            (Path(out) / stem).with_suffix(".cubin").write_bytes(cubin)
            (Path(out) / stem).with_suffix(".sass").write_text(sass)
            written[key] = [str(stem.with_suffix(".cubin")), str(stem.with_suffix(".sass"))]
        r["files"] = written[key]
        if r.get("cubin") is None:
            r["cubin"] = str((Path(out) / written[key][0]).resolve())


def collect_workload(name: str, archs=(WORKLOAD_ARCH,), out: Path | None = None, *, overrides: dict | None = None,
                     jobs: int | None = None, num_sms: int = 132, pool: cf.ProcessPoolExecutor | None = None,
                     on_done=None) -> dict:
    """``kernels.json`` of workload ``name``: its rome variants' launches (and Liger-Kernel's where
    installed) compiled for ``archs`` into Triton's cache, each with the bandwidth model.
    Captures in a worker; ``out``: where the cubins and SASS (with encodings) are copied."""
    t0 = time.perf_counter()
    with pool if pool is not None else compiler_pool(jobs or default_jobs()) as pool:
        captured = {cc: pool.submit(workload_launches, name, overrides, cc=cc, num_sms=num_sms).result()
                    for cc in archs}
        plan = []
        for cc in archs:
            liger = captured[cc]["liger"]
            plan += [(L, ARCHS[cc]) for L in captured[cc]["launches"] + liger.get("launches", [])]
        results = compile_all(pool, [L["job"] for L, _ in plan], on_done)
    rows = [launch_row(L, arch, results[L["job"]]) for L, arch in plan]
    files = [(results[L["job"]].get("cubin"), results[L["job"]].get("sass")) for L, _ in plan]
    if out is not None:
        _write_files(out, rows, files)
    first = captured[archs[0]]
    liger = first["liger"]
    return json_safe({
        "environment": environment(), "workload": first["workload"], "capture": first["capture"],
        "num_sms": num_sms, "archs": [ARCHS[cc].name for cc in archs], "wall_s": time.perf_counter() - t0,
        "builds": len(results), "method": MODEL_METHOD, "gpus": {g.name: dataclasses.asdict(g) for g in GPUS.values()},
        "gpu_notes": GPU_NOTES, "skipped": first["skipped"],
        "liger": {k: v for k, v in liger.items() if k != "launches"},
        "launches": [r for r in rows if r["variant"] != "liger-kernel"],
        "liger_launches": [r for r in rows if r["variant"] == "liger-kernel"],
    })
