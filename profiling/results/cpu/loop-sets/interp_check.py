"""Under TRITON_INTERPRET=1: ../late-partner/interp_check.py's check (rome.apply_qk, backend="triton",
and its backward on 44/44/40 half sections, fp32/fp16/bf16) on q 11 heads and k 6, 17 rows (three
T tiles, the last partly masked), saved to OUT; compare two runs' files bit for bit with
--compare A B.
The interpreter's launch walks 3 heads a program (rome.launcher: the SEAM build, where PING takes
no effect); here every program walks all 17 heads (launch.gather_groups' ``heads``, replaced as
the GPU's launch of default's shapes has it: one group, q's heads then k's), so the loop of PING's
sets runs more than one iteration and ends on sets past each tensor's last head. Both runs of a
comparison take that launch.
    PING=1 ROME_GATHER_DEPTH=2 TRITON_INTERPRET=1 PYTHONPATH=<tree with loop-sets.patch> python interp_check.py OUT"""
import importlib.util
import sys
from pathlib import Path

from rome import launch

_spec = importlib.util.spec_from_file_location("late_check", Path(__file__).resolve().parents[1] / "late-partner" /
                                               "interp_check.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)
_groups = launch.gather_groups


def _all_heads(cfg, n_t, ha, hb, sms, **kw):
    return _groups(cfg, n_t, ha, hb, sms, **{**kw, "heads": ha + hb})


launch.gather_groups = _all_heads

if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(0 if check.compare(sys.argv[2], sys.argv[3]) else 1)
    check.run(sys.argv[1], q_heads=11, k_heads=6, rows=17)
