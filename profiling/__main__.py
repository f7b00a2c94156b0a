"""``python -m profiling report [--workload NAME] [--shape B,N,S,D] [--dtype bf16] [--out DIR] [--skip-models]``
``python -m profiling kernels [--arch sm_80,sm_90,sm_100] [--out DIR] [--jobs N]``: every configuration;
``python -m profiling kernels --workload NAME [--arch sm_90] [--out DIR]``: that workload's launches with the
static bandwidth model (kernels.json, kernels.md);
``python -m profiling matrices [--out DIR] [--no-pictures]``: matrices/, every family's M as a record and a picture;
``python -m profiling families [--out PATH]``: docs/families.md, from rome's family tables;
``python -m profiling overhead [--baseline DIR] [--out DIR]``: host µs per call of the entry points."""

import argparse
import json
import os
import sys

import torch

# Without a GPU the Triton kernel runs through Triton's interpreter (for its precision); the
# variable must be set before rome's kernel module is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from . import families, matrices, overhead  # noqa: E402
from .static import cli as kernels_cli  # noqa: E402
from .report import report  # noqa: E402
from .workloads import WORKLOADS  # noqa: E402


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m profiling", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("report", help="speed + precision report for one workload")
    p.add_argument("--workload", default="default", choices=sorted(WORKLOADS))
    p.add_argument("--shape", help="B,N,S,D or B,Nq,Nk,S,D (S at most the workload's grid)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="q/k dtype for the speed part")
    p.add_argument("--out", help="output folder (default reports/<workload>-<timestamp>/)")
    p.add_argument("--precision-tokens", type=_positive_int, default=256,
                   help="CPU only: tokens sampled across the sequence for precision (default 256)")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--skip-precision", action="store_true")
    p.add_argument("--skip-models", action="store_true",
                   help="leave out the model workload (a Wan block and a Llama layer, unpatched vs patched)")
    p.add_argument("--skip-kernels", action="store_true",
                   help="leave out the ahead-of-time compile of the workload's launches (the kernels section)")
    p.add_argument("--arch", type=kernels_cli.arch_list,
                   help="archs of the kernels section (default sm_90; see `kernels --help`)")
    k = sub.add_parser("kernels", help="compile the GPU kernel ahead of time (no GPU needed), read its cubins and "
                                       "model its bandwidth (--workload NAME: just that workload's launches)")
    kernels_cli.add_arguments(k)
    mx = sub.add_parser("matrices", help="write matrices/: every family's rotation matrix as a record (JSON) "
                                         "and a picture (PNG), and its README")
    matrices.add_arguments(mx)
    fa = sub.add_parser("families", help="write docs/families.md: every family rome.integrations.patch patches "
                                         "or refuses, from rome's own tables")
    families.add_arguments(fa)
    o = sub.add_parser("overhead", help="host µs per call of apply_qk, apply_qk_at and RoPE beside the eager "
                                        "rotate_half chain (launches recorded on a CPU, real on a GPU)")
    overhead.add_arguments(o)
    args = parser.parse_args(argv)
    if args.command == "report":
        out = report(args)
        failed = json.loads((out / "results.json").read_text()).get("failed")
        if failed:
            sys.exit(f"make report: {len(failed)} part(s) failed (listed at the top of {out / 'report.md'})")
    elif args.command == "kernels":
        kernels_cli.main(args)
    elif args.command == "matrices":
        matrices.main(args)
    elif args.command == "families":
        families.main(args)
    elif args.command == "overhead":
        overhead.main(args)


if __name__ == "__main__":
    from .frames import call_in_a_wide_frame

    if os.environ.get("TRITON_INTERPRET") == "1":  # (profiling/interpreter.py)
        from .interpreter import speed_up

        speed_up()

    # (the interpreter's kernel frames: a wide frame keeps CPython 3.11/3.12's frame stack from
    # mapping and unmapping a chunk per call, profiling/frames.py)
    call_in_a_wide_frame(main)
