"""A workload's launches of VARIANT (the decode workload's, bf16, unless WORKLOAD and DTYPE are
given; its first N distinct loads where N is): each global load of the slowest SM's first
program's warp 0, as the model schedules it at the worst end (800 ns, 1.755 GHz): path position,
SASS address, opcode, class (dram / l2 / hit), issue and completion cycle.
    PYTHONPATH=<tree> TRITON_CACHE_DIR=<dir> python loadtrace.py rome.apply_qk_at
    PYTHONPATH=<tree> TRITON_CACHE_DIR=<dir> python loadtrace.py rome.RoPE default bf16 40"""
import sys
from profiling.static import launches, schedule
from profiling.static.archs import ARCHS
from profiling.static.compile import compile_all, compiler_pool

TRACES, PATHS = [], []
_simulate, _classify = schedule.simulate, schedule.classify


def simulate(*a, **k):
    tr = []
    r = _simulate(*a, trace=tr, **k)
    TRACES.append((k.get("dram_cycles"), tr, r["cycles"]))
    return r


def classify(path, params, l1=None):
    out = _classify(path, params, l1)
    PATHS.append((path, out))
    return out


schedule.simulate, schedule.classify = simulate, classify


def main():
    variant = sys.argv[1]
    with compiler_pool(1) as pool:
        workload, dtype = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("decode", "bf16")
        most = int(sys.argv[4]) if len(sys.argv) > 4 else None
        cap = pool.submit(launches.workload_launches, workload, {"dtype": dtype}, variants=(variant,),
                          liger=False).result()["launches"]
        res = compile_all(pool, [L["job"] for L in cap])
        for L in cap:
            TRACES.clear(); PATHS.clear(); schedule._CACHE.clear()
            row = launches.launch_row(L, ARCHS[90], res[L["job"]])
            end = row["schedule"]["ends"]["800ns@1.755GHz"]
            # (the slowest of the SMs' program sequences the model ran at the worst end)
            _, trace, cycles = max((t for t in TRACES if abs(t[0] - 800 * 1.755) < 1), key=lambda t: t[2])
            path, loads = PATHS[0]
            print(f"== {variant} {L['pass']}: {end['us']:.3f} us on the slowest SM ({cycles:.0f} cycles of its last program's SM)")
            seen = set()
            for prog, slot, pc, t, done, lt in trace:
                if slot != 0 or pc in seen or (most is not None and len(seen) > most):
                    continue
                seen.add(pc)
                ins = path[pc]
                print(f"  pos {pc:5d} {ins.addr:#07x} {ins.opcode:14s} {lt:5s} issue {t:7.0f} done {done:7.0f}")


if __name__ == "__main__":
    main()
