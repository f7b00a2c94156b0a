"""How the kernel is launched: its specialisation, chosen apart from launching it.

``plan(matrix, x_dtype, table_dtype, transpose=...)`` gives the ``Config`` (a small frozen record
of the constexprs and tile sizes) and the per-matrix facts the launch needs (the nonzero block
mask, the gather index of the transpose); ``kernel_configs()`` enumerates every ``Config`` the
launcher can choose, with the exact Triton signature of a real launch, so that
``python -m profiling kernels`` compiles and inspects precisely what runs.

Tile sizes (GPU): rows per tile ``BLOCK_R`` = 32 keeps the fp32 panel accumulator, x, cos, sin
and the error-free-sum temporaries of a [32, 64] panel in ~16 registers each at 4 warps, with
room to spare for fp32's three-piece split; the panel width 64 bounds the matrix block a dot
reads (8 KB bf16, 16 KB fp32) whatever D is, so D=256 fits as well as D=64. The grid is
persistent: at most 8 programs per SM (``max_programs``), of which as many run at once as the
compiled kernel's registers and shared memory let fit (the inspection tool's occupancy columns).
No size here was timed on a GPU yet; the inspection tool's table shows what each choice costs.

Autotuning (GPU). ``candidates(cfg)`` lists the launch configs ``rome.tuning`` times on a GPU for
one specialisation (x dtype, head_dim, pass, tables, positions: every field of ``Config`` but the
tile rows and warps): ``choose``'s first, then the same work a thread in a program of half and
of twice the size (half the rows on half the warps, twice the rows on twice the warps), each
where it stays a legal launch: at most 8 warps (256 threads at up to 255 registers fill the 64K
register file). Which of them moves bytes fastest is what a GPU's timing decides; the model puts
them within a few points of each other (``candidates``). The panel width
``BLOCK_N`` is never tuned: the block mask and the in-place rule (``rome.inplace``) depend on it.
Tuned are the specialisations whose bits cannot depend on the tile: M a signed permutation (each
output of the dot one exact term) with fp32 tables or caches, not ``angles`` (its tiles are sized
to compile without spill). A general matrix keeps ``choose``'s config: its sums could round
differently on another tile shape. Every candidate is compiled by ``kernel_configs`` (the static
gate), so a tuned launch is one CI checked for spill and shared memory. Under the interpreter
there is one candidate.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from . import kernel
from .positions import AXIS_RUNS
from .settings import ThreadSetting
from .structure import describe

MAX_HEAD_DIM = 256
TL_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
_NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
PANEL = 64
POSITIONS_NAME = {0: "none", 1: "1-axis", 2: "axes"}
_PROGRAMS_PER_SM = 8
_INTERPRET_PROGRAMS = 3  # few programs, so the tests walk the persistent loop
_INTERPRET_BLOCK_R = 16
MIN_ROWS = 16  # tile rows: tl.dot's M on triton 3.2-3.4 (3.5+ take fewer)
TRITON_VERSION = tuple(int(v) for v in re.findall(r"\d+", triton.__version__)[:2])
# the compilers the register-bound choices below were read off (every sm_90 configuration compiled
# without spill: the committed tables, `make gate`): triton 3.6 (the GPU machines', torch 2.10-2.11's)
# and 3.9+ (torch 2.15's). Under another (3.7: torch 2.12-2.13's CUDA builds, 3.7.1 compiled, 3.7.0
# of torch 2.12.0 not; 3.8: torch 2.14's; before 3.6, not compiled) the choices that spilled there
# take a smaller build: of every configuration for sm_90, sm_80 and sm_100, 5 spilled under 3.7.1
# and 6 under 3.8.0; with TOKEN_BWD_ARCHS, TOKEN_FWD_ARCHS_ANY_COMPILER, PAIRS_DEPTH and candidates()
# keyed on this, none (the general matrix's FMA dot, 3 under 3.7.1, is on 4 warps under every
# compiler: choose()); sm_100's fp32 gathers, 9 builds under 3.6 and 1 under 3.9 at 8-16 B of
# stack, none since src_again (profiling/results/cpu/triton-37-38/, gate-36-39/, src-again/)
TUNED_COMPILER = TRITON_VERSION == (3, 6) or TRITON_VERSION >= (3, 9)


def _has_maxnreg() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "maxnreg" in getattr(CUDAOptions, "__dataclass_fields__", {})


_HAS_MAXNREG = _has_maxnreg()


# --- AMD (HIP): the archs the kernel is compiled and checked for, and the options a launch passes ---

# AMD Instinct archs whose every configuration is compiled and read (python -m profiling kernels
# --arch gfx942,gfx90a,gfx950: profiling/results/cpu/kernels-amd/; CI compiles a gfx942 subset): no
# memory spill, LDS within the CU's, no SGPR spill in the gather (docs/amd.md). backend="auto" takes
# the kernel on these only (rome.ops), the torch backend on any other ROCm device. Never run on one.
HIP_ARCHS = ("gfx90a", "gfx942", "gfx950")


def runtime_backend() -> str:
    """The Triton backend a launch from this torch build compiles for: "hip" on ROCm, else "cuda"."""
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


@functools.lru_cache(maxsize=4)
def _hip_option_names() -> frozenset | None:
    try:
        from triton.backends.amd.compiler import HIPOptions
    except ImportError:
        return None
    return frozenset(HIPOptions.__dataclass_fields__)


def target_options(options: dict, backend: str | None = None) -> dict:
    """``options`` (a ``Config``'s, as the CUDA backend takes them) as a launch compiling for
    ``backend`` ("cuda" or "hip"; default ``runtime_backend()``) passes them. Triton's JIT raises
    KeyError for a keyword its backend's options do not have, so for HIP only what ``HIPOptions``
    lists is kept: ``enable_fp_fusion`` stays, ``maxnreg`` (ptxas's register cap) goes."""
    backend = backend or runtime_backend()
    if backend == "cuda":
        return dict(options)
    if backend != "hip":
        raise ValueError(f"backend must be 'cuda' or 'hip', got {backend!r}")
    names = _hip_option_names()
    return {k: v for k, v in options.items() if (k in names if names is not None else k != "maxnreg")}


@dataclass(frozen=True)
class Config:
    """One specialisation of the kernel (everything but the matrix's block mask)."""

    x_dtype: torch.dtype
    table_dtype: torch.dtype
    head_dim: int
    transpose: bool
    gather_sin: bool  # transpose of a signed permutation: one dot, sin read at src
    split: int  # pieces of the dot operand
    op_dtype: object  # tl dtype of the pieces
    fp32_dot: bool  # fp32 operands, IEEE
    block_r: int
    block_d: int
    block_n: int
    raw_x: bool
    raw_t: bool
    num_warps: int = 4
    num_stages: int = 1
    positions: int = 0  # 0: per-row tables; 1: cache rows by one position; 2: by pos[r, axis[j]]
    angles: bool = False  # with positions: cos/sin computed from them and the frequencies
    maxnreg: int | None = None  # registers per thread ptxas may use (None: its own target)
    permutation: bool = False  # M is a signed permutation: every tile gives the same bits (tunable)
    product: str = "dot"  # how x @ M is evaluated: "dot" (tensor cores) or "gather" (x[:, src] * sign)
    raw_s: bool = False  # interpreter: sin is bf16, read as raw bits (raw_t: cos)
    sin_dtype: torch.dtype | None = None  # sin's dtype where it differs from cos's (table_dtype)
    heads: bool = False  # the head-group kernel (kernel._rome_gather_kernel; its product: gather or dot)

    @property
    def options(self) -> dict:
        """Compile options of a GPU launch: fp fusion off (the error-free sums rely on separate
        roundings), and ``maxnreg`` where this Triton has it (3.0+; older ones ignore the hint)."""
        options = {"enable_fp_fusion": False}
        if self.maxnreg is not None and _HAS_MAXNREG:
            options["maxnreg"] = self.maxnreg
        return options

    @property
    def name(self) -> str:
        kind = "ieee" if self.fp32_dot else f"{self.split}x{str(self.op_dtype).split('.')[-1]}"
        if self.product == "gather":
            kind = "gather"
        elif self.heads:  # the seed's dot in the head-group kernel (M once per program)
            kind = f"dot-{kind}"
        gather = " gather-sin" if self.gather_sin else ""
        pos = f" positions={POSITIONS_NAME[self.positions]}" if self.positions else ""
        pos += " angles" if self.angles else ""
        tables = _NAME[self.table_dtype] + (f"/{_NAME[self.sin_dtype]}" if self.sin_dtype else "")
        product = f"product={kind}" if self.heads else f"dot={kind}"
        return (f"{_NAME[self.x_dtype]} {'bwd' if self.transpose else 'fwd'} D={self.head_dim} "
                f"tables={tables} {product}{gather}{pos}")


def _exact_in(m: torch.Tensor, dtype: torch.dtype) -> bool:
    return bool((m.to(dtype).to(m.dtype) == m).all()) if m.dtype != dtype else True


PRODUCTS = ("gather", "dot")
_product = ThreadSetting("gather")


@contextlib.contextmanager
def product(name: str):
    """Evaluate ``x @ M`` of signed-permutation matrices (every rotation matrix) as ``name`` in
    this thread: ``"gather"`` (the default: the exact signed column gather, ``_rome_gather_kernel``)
    or ``"dot"`` (the seed's matmul formulation on the tensor cores: the same kernel's ``DOT``, or
    ``_rome_kernel`` for D > 128); the bits are the same. General matrices always take the dot
    (``_rome_kernel``). The report measures both."""
    if name not in PRODUCTS:
        raise ValueError(f"product must be one of {PRODUCTS}, got {name!r}")
    with _product.scoped(name):
        yield


def current_product() -> str:
    return _product.get()


_lanes: ThreadSetting[int | None] = ThreadSetting(None)


@contextlib.contextmanager
def target_warp_size(lanes: int):
    """Choose launches in this thread for a GPU whose warps have ``lanes`` lanes (64 on AMD
    Instinct, 32 on NVIDIA), e.g. to list an AMD arch's configurations on another machine."""
    if lanes not in (32, 64):
        raise ValueError(f"lanes must be 32 or 64, got {lanes!r}")
    with _lanes.scoped(lanes):
        yield


def warp_size() -> int:
    """Lanes per warp of the GPU launches are chosen for: ``target_warp_size``'s, else the
    runtime's (64 on a ROCm build, 32 otherwise)."""
    return _lanes.get() or (64 if runtime_backend() == "hip" else 32)


_arch: ThreadSetting[int | str | None] = ThreadSetting(None)


@contextlib.contextmanager
def target_arch(arch: int | str):
    """Choose launches in this thread for the GPU ``arch``: an NVIDIA compute capability as an
    int (90 for sm_90) or an AMD arch name ("gfx942", whose warps have 64 lanes), e.g. to list
    another GPU's configurations on this machine (``rome.launcher.kernel_configs(arch)``)."""
    if isinstance(arch, bool) or not isinstance(arch, (int, str)) or (isinstance(arch, str) and not arch.startswith("gfx")):
        raise ValueError(f"arch must be a compute capability (an int, e.g. 90) or an AMD arch name "
                         f"('gfx942'), got {arch!r}")
    with _arch.scoped(arch), target_warp_size(64 if isinstance(arch, str) else 32):
        yield


@functools.lru_cache(maxsize=16)
def _device_arch(index: int) -> int | str:
    props = torch.cuda.get_device_properties(index)
    if runtime_backend() == "hip":
        return props.gcnArchName.split(":")[0]
    return props.major * 10 + props.minor


def current_arch(device: torch.device | None = None) -> int | str | None:
    """The GPU arch launches are chosen for: ``target_arch``'s, else that of ``device`` (a GPU
    tensor's device; the current GPU where None), else None (no GPU: the interpreter)."""
    arch = _arch.get()
    if arch is not None:
        return arch
    if device is not None and device.type != "cuda":
        return None
    if device is None and not torch.cuda.is_available():
        return None
    return _device_arch(device.index if device is not None and device.index is not None
                        else torch.cuda.current_device())


# The head groups' gather loop takes DEPTH heads a batch (the next batch's loads issued before this
# batch's arithmetic: DEPTH heads' bytes in flight through an iteration, 2 KB each in bf16 at
# D = 128) at a register cap of 128 (4 programs, 16 warps, per SM). For 16-bit x, no norm or the
# norm over a token's heads: 3 where every such build compiles without spill (the static tables:
# sm_90 under triton 3.6 and 3.9, ~21 KB/SM in flight where 2 held ~15 KB/SM, latency-bound on an
# H200 at 800 ns in the model; the AMD archs; sm_80 in bf16), else 2 (3 spilled on sm_80 in fp16,
# 8-16 B, and on sm_100, bf16 8 B and fp16 32-40 B, under triton 3.9). fp16 keeps the TwoSum where bf16 takes the
# short sum (kernel._dot2_short): on sm_100 its two heads spilled 8 B at 128, so there its cap is
# 168 (146-148 registers, 3 programs: 12 KB/SM in flight, where one head at 128 held 8). Two heads
# for fp32 x (3 spilled 8-16 B), under the per-head norm prologue (3 spilled 8 B at its cap) and in
# the norm's backward (3 spilled 16 B), one there for fp32 x (2 spilled 16-56 B) and for the
# LayerNorm's on sm_100 (2 spilled 8 B at 168). The bytes in flight are modelled for H100/H200 only.
# On sm_90 (the H100/H200), bf16 x without a norm (the SEAM build's of 4+ heads a program too,
# a prefill whose T tiles are few: Llama's q/k of 8k tokens): 4 (8 KB a program in
# flight at D = 128, as fp32's 2; with 3 the model put every bf16 launch of default, llama-1d, wan
# and hunyuan-video at 88-94% of an H200's copy, latency-bound at 800 ns: 20-25 KB/SM in flight;
# with 4, 89-97%: profiling/results/cpu/depth4/), where every such build of the static table
# compiles without spill under triton 3.6 and 3.9. fp16 at 4 spilled 8-16 B (20 of its 100 sm_90
# builds: positions on several axes, angles), fp32 x at 3 spilled 8-176 B.
# ROME_GATHER_DEPTH (1-4, read at import) overrides the depth, for timing it on a GPU
# (profiling/bench_kernel.py --sweep); the static tables hold the defaults only
DEPTH3_ARCHS = (90, *HIP_ARCHS)
DEPTH4_ARCHS = (90,)
DEPTH4_DTYPES = (torch.bfloat16,)
GATHER_DEPTH_OVERRIDE = int(os.environ.get("ROME_GATHER_DEPTH", "0"))


def gather_depth(arch: int | str | None, x_dtype: torch.dtype, norm: str | None = None,
                 backward: bool = False, apart: bool = False, heads: int | None = None) -> int:
    """Heads a batch of the head groups' gather loop (kernel DEPTH; a permutation that breaks
    pairs takes one whatever this says; the dot's: ``dot_depth``) for ``x_dtype`` on ``arch``
    (None: no GPU, the interpreter, as sm_90), ``norm`` the fused norm ("rms", "layer", "rms_heads" or None), in its
    ``backward`` (the transpose's epilogue) or the forward's prologue; ``apart``: the ``SEAM``
    build (``head_groups``), whose prologue holds the first batch's loads with the tables: fp16
    takes two there (three spilled 8 B on sm_90, triton 3.9), and where a program has fewer than
    four ``heads`` (a decode step's three) the SEAM build keeps three, not four: its one batch
    would hold a fourth head masked off (the model: decode 1.39 -> 1.51 us forward on an H100)."""
    if GATHER_DEPTH_OVERRIDE:
        return GATHER_DEPTH_OVERRIDE
    half = x_dtype != torch.float32
    if norm is not None and backward:
        return 1 if not half or (norm == "layer" and arch == 100) else 2
    if not half or norm in ("rms", "layer") or (apart and x_dtype == torch.float16):
        return 2
    if norm is None and x_dtype in DEPTH4_DTYPES and (arch is None or arch in DEPTH4_ARCHS) \
            and not (apart and heads is not None and heads < 4):
        return 4
    return 3 if arch is None or arch in DEPTH3_ARCHS or (arch == 80 and x_dtype == torch.bfloat16) else 2


def src_again(arch: int | str | None) -> bool:
    """The head groups' ``SRC_AGAIN``: k's partner offsets from src read again past q's heads (L1
    or L2 hits, once a program), not formed from q's. LLVM folds q's form, (xrow_a + src) + (xrow_b -
    xrow_a), back to xrow_b + src and holds src through q's loop: on sm_100 at 128 registers fp32
    x's gathers at half sections then kept it on the stack (8-16 B written before q's loop and read
    after it; 9 builds under triton 3.6, one tuner candidate under 3.9), none with the reread
    (profiling/results/cpu/src-again/). For every x dtype there: bf16's and fp16's builds mostly
    take fewer registers with it (not timed). Not on sm_90, where the model moved default's bf16
    by -0.2 / -0.4 points (3.6) with it, nor on sm_80 or AMD, which kept no stack there."""
    return arch == 100


def first_batch_first(arch: int | str | None, x_dtype: torch.dtype) -> bool:
    """The head groups' gather's ``FIRST`` (outside the ``SEAM`` build, which always does it): its
    whole first batch issued before the tables, whose layout conversions' barriers held those loads
    back a round trip. On sm_90 (and the interpreter, as sm_90) but for fp16 x, whose forwards at
    three heads a batch spilled 8 B there (triton 3.6); elsewhere not compiled and gated. By the
    model (default, bf16, sm_90, triton 3.6, worst end): forward 114.0 -> 108.6 us, backward
    123.2 -> 115.9 (H200 91.8 / 90.0 -> 92.7 / 91.4% of copy), fp32 H200 95.0 / 94.7 -> 95.5 /
    95.4 (static estimates, profiling/results/cpu/gather-trials/ section 5)."""
    return arch in (90, None) and x_dtype != torch.float16


# The head groups' dot on sm_90, 16-bit x, BLOCK_D = 128, no angles: 64 rows on 16 warps at the
# 128-register cap (one program an SM) and, for bf16, two heads a batch (the kernel's DEPTH,
# dot_depth).
# The 32 x 8 tile's mma warps read M from shared memory once per 16 rows each: ~40 B of L1
# traffic an element, L1-bound at 61% of an H200's copy by the model (measured: 58%, call J);
# at 64 rows 16 B an element, and with the second head's loads in flight through the first's
# dot, by the model (triton 3.6, default bf16, 800 ns, H100 / H200): forward 77 / 61% -> 89 /
# 77%, backward 77 / 60% -> 88 / 74% (profiling/results/cpu/dot-wide/: 64 x 8 at 255 registers
# 85 / 71%, with two heads 87 / 74%; three heads at 64 x 16 spilled 136-144 B)
DOT_WIDE_ARCHS = (90,)
DOT_WIDE_ROWS = 64
DOT_WIDE_WARPS = 16
# heads a batch by x dtype: fp16's sum (_dot2, the TwoSum) spilled 56-64 B at two heads; with one,
# 64 x 16 still beat 32 x 8 by ~10 points (the static table's fp16 dot rows, sm_90, triton 3.6)
DOT_WIDE_DEPTH = {torch.bfloat16: 2, torch.float16: 1}  # (its keys: the dtypes that take the tile)


def dot_wide(arch, x_dtype, block_d: int, angles: bool = False, lanes: int = 32) -> bool:
    """Whether the head groups' dot takes the wide tile (``DOT_WIDE_ROWS`` x ``DOT_WIDE_WARPS``,
    ``DOT_WIDE_DEPTH``'s heads a batch) on ``arch`` (None: no GPU, the interpreter, as sm_90)."""
    return (arch is None or arch in DOT_WIDE_ARCHS) and x_dtype in DOT_WIDE_DEPTH and block_d == 128 \
        and not angles and lanes == 32


def dot_depth(cfg: Config, arch: int | str | None) -> int:
    """Heads a batch of the head groups' dot (kernel DEPTH with DOT) for its config ``cfg`` on
    ``arch``: ``DOT_WIDE_DEPTH``'s for x's dtype with the wide tile (``dot_wide``: two for bf16),
    else one; the interpreter (``arch`` None) takes the wide tile's depth at any D, so that the
    CPU tests run its loop (its tile there is the interpreter's few rows)."""
    if cfg.angles or (arch is not None and (cfg.block_r, cfg.num_warps) != (DOT_WIDE_ROWS, DOT_WIDE_WARPS)):
        return 1  # (on a GPU: choose_gather did not give it the wide tile)
    return DOT_WIDE_DEPTH.get(cfg.x_dtype, 1)


def gather_registers(arch: int | str | None, x_dtype: torch.dtype) -> int:
    """The head groups' gather register cap (without a norm: ``norm_registers``)."""
    return 168 if arch == 100 and x_dtype == torch.float16 else 128


# the norm prologue's register cap: at the gather's 128 its row statistics, weights and biases
# spill 8-32 B (sm_90/sm_100) with two heads a batch; 168 keeps 3 programs (12 warps) per SM
NORM_MAXNREG = 168
# but the per-head RMSNorm's forward on sm_80 and sm_90: two heads a batch fit the gather's 128
# without spill there (triton 3.6 and 3.9, every x dtype at D = 64 and 128, the SEAM build's too),
# 4 programs an SM: Qwen3's fused forward 77.6 -> 83.6% of copy by the model (H100, 3.6), Flux's
# 83.1 -> 83.9% (profiling/results/cpu/norm-cap-128/; not measured on a GPU). On sm_100 it spilled
# 8-16 B at 128, its backward 40-72 B (sm_90), the LayerNorm's prologue 8-32 B: those keep 168
NORM_RMS_MAXNREG = 128
NORM_RMS_ARCHS = (None, 80, 90)  # (None: no GPU, the interpreter, chosen as sm_90)


# and the LayerNorm's backward of fp16 x at D <= 64 on sm_80 under triton before 3.9: at 168 it
# spilled 8 B of stack there under 3.6 (the only norm configuration that did, 3.9 none), at 176
# none (2 programs an SM where 168 held 3): profiling/results/cpu/token-unmasked/
NORM_LAYER_FP16_SM80_MAXNREG = 176
_TRITON_BEFORE_3_9 = TRITON_VERSION < (3, 9)


def norm_registers(norm: str, *, backward: bool, arch: int | str | None = None, x_dtype=None,
                   head_dim: int | None = None) -> int:
    """The register cap of a gather launch with the fused norm ``norm`` ("rms", "layer",
    "rms_heads"): its prologue (forward) or its backward's epilogue, on ``arch``
    (``current_arch``), for x of ``x_dtype`` and ``head_dim`` (the LayerNorm backward's case)."""
    if norm == "layer" and backward and arch == 80 and x_dtype == torch.float16 and head_dim is not None \
            and head_dim <= 64 and _TRITON_BEFORE_3_9:
        return NORM_LAYER_FP16_SM80_MAXNREG
    return NORM_RMS_MAXNREG if norm == "rms" and not backward and arch in NORM_RMS_ARCHS else NORM_MAXNREG


# x elements a thread holds per tile in the gather kernel: 8 (bf16 fwd D=128, sm_90: 64 registers
# and 8 resident CTAs with triton 3.9, 103 and 4 with 3.6) where 16 took 130 / 204 registers and
# 3 / 2 CTAs for ~the same instructions per element: more resident warps, more loads in flight
GATHER_ELEMENTS_PER_THREAD = 8


@functools.lru_cache(maxsize=1024)
def choose_gather(x_dtype, table_dtype, head_dim: int, *, transpose: bool, interpret: bool = False,
                  positions: int = 0, angles: bool = False, sin_dtype=None, product: str = "gather",
                  lanes: int = 32, arch: int | str | None = None) -> Config:
    """The gather kernel's specialisation: T rows per program so that a thread holds
    ``GATHER_ELEMENTS_PER_THREAD`` elements of a tile (x, its gathered copy, the prefetched next
    head's two, cos and sin: ~6 values each), 4 warps; with angles half the rows (the angle
    arithmetic holds ~40 more fp32 values per element, once per program) and 8 warps for fp32 x
    and D = 256 (the transpose at 8 warps held 2 elements a thread, 8 KB in flight per SM: 72% of
    copy in the model for default's bf16 backward; at 4 warps 99%). Heads per program are chosen
    per launch (``heads_per_program``).

    ``product="dot"``: the same kernel with ``x @ M`` as the seed's tensor-core dot, M read once
    per program (a [D, D] operand, D <= ``HEADS_DOT_MAX_D``): half-precision x is the operand as
    it is (exact: one ±x term per output), fp32 x three bf16 pieces (exact), the interpreter fp32
    operands; 32 rows on 256 threads (8 warps of 32 ``lanes``, 4 of 64: 8 64-lane waves spilled
    on gfx942, where a SIMD then holds two of the workgroup's waves at <= 256 VGPRs each), 16 rows
    for fp32 x's pieces; 16-bit x on sm_90 at BLOCK_D 128 the wide tile, 64 rows on 16 warps
    (``dot_wide``, with ``dot_depth``'s heads a batch: two for bf16). ``arch``: the GPU compiled
    for (``current_arch``), which sets the gather's register cap (``gather_registers``)."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    num_warps = 4
    block_r = min(64, max(1, GATHER_ELEMENTS_PER_THREAD * 32 * num_warps // block_d))
    if angles:
        block_r = max(1, block_r // 2)
        if x_dtype == torch.float32 or block_d > 128:
            num_warps = 8
    sin_dtype = None if sin_dtype in (None, table_dtype) else sin_dtype
    split, op, fp32_dot, maxnreg = 1, TL_DTYPE[x_dtype], False, gather_registers(arch, x_dtype)
    if product == "dot":
        if x_dtype == torch.float32:
            split, op = 3, tl.bfloat16
        fp32_dot = interpret
        # 32 rows on 8 warps (2 CTAs per SM at the 128-register cap): a warp's mma reads its
        # slice of M from shared memory once per 16 rows it owns, so M's traffic per element
        # halves from 16 rows; the model (bf16 D=128, sm_90): 16 rows x 4 warps 82% of copy, 32 x 8
        # 86% (triton 3.9 and 3.6), 32 x 4 at up to 255 registers 92-100% but at 249-255 of them.
        # fp32 x's three pieces: 32 rows spilled 136-144 B; 16 x 8, 115-116 registers, by the corrected
        # model 65-66% (H100) / 49-50% (H200), L1-bound: every warp reads each whole piece of x from
        # shared memory as its A operand (no tile, depth or stacking tried did better:
        # profiling/results/cpu/dot-fp32/). Angles:
        # the backward's two angle tables spilled 104-184 B at 32 rows (triton 3.9, sm_80/sm_90)
        # and at 16 on sm_100 under the 128-register cap: 16 rows, no cap
        # fp16 on sm_100 (triton 3.9): 32 rows spilled 24-32 B at D = 80-128 under the 128 cap (164
        # registers at 168: one program per SM); 16 rows take 104-105, two programs
        half_rows = x_dtype == torch.float32 or angles or (arch == 100 and x_dtype == torch.float16)
        block_r, num_warps = (16 if half_rows else 32), 256 // lanes
        maxnreg = 255 if angles else 128
        if dot_wide(arch, x_dtype, block_d, angles, lanes):
            block_r, num_warps = DOT_WIDE_ROWS, DOT_WIDE_WARPS
    return Config(
        x_dtype=x_dtype, table_dtype=table_dtype, head_dim=head_dim, transpose=transpose,
        gather_sin=transpose, split=split, op_dtype=op, fp32_dot=fp32_dot,
        block_r=_INTERPRET_BLOCK_R if interpret else block_r, block_d=block_d, block_n=block_d,
        raw_x=interpret and x_dtype == torch.bfloat16, raw_t=interpret and table_dtype == torch.bfloat16,
        raw_s=interpret and (sin_dtype or table_dtype) == torch.bfloat16, sin_dtype=sin_dtype,
        # the register cap (gather_registers; the dot's above): 128 keeps 4 programs (16 warps) per
        # SM; the loop's batch of three heads (four for bf16 on sm_90, two for fp32 x; gather_depth)
        # takes 118-128 registers without spill on triton 3.6 and 3.9 (bf16 D=128, sm_90).
        # (With one head a batch, ptxas left
        # to itself took 64 registers by issuing the next head's loads after the arithmetic; 72
        # spilled 32-88 B under triton 3.6)
        num_warps=num_warps, positions=positions, angles=angles, maxnreg=maxnreg, permutation=True,
        product=product, heads=True,
    )


# Angles at twice choose_gather's rows where the launch is not a decode step's SEAM build (16-bit x,
# the gather product, no norm): choose_gather halves the rows for the angle arithmetic's registers,
# which left a program's bytes in flight at half the tables' form: measured on an H100 under triton
# 3.6 (profiling/results/h100/forms-f1c73eb) the angles forward at 81-84% of copy where the tables'
# ran at 92-94%; at full rows default's 89%, Wan's 93% (profiling/results/h100/angles-rows-81bc720),
# at 112-128 registers without spill (sm_80/90/100, triton 3.6 and 3.9). A decode step's SEAM
# launch keeps the half rows (at full rows its programs' latency grew 2.1 -> 3.7 us in the model)
ANGLE_FULL_ROWS = True


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of ints: triton.cdiv's value without its constexpr handling (~13 µs a call on
    CI's CPUs, several times a launch)."""
    return -(-a // b)


def angle_rows(cfg: Config, *, norm: bool = False, interpret: bool = False) -> Config:
    """The angles' wide tile: twice ``cfg``'s rows (``choose_gather``'s half rows) for 16-bit x,
    the gather and D <= 128 (``ANGLE_FULL_ROWS``); ``cfg`` itself otherwise (a norm, fp32 x, the dot,
    D > 128, the interpreter's fixed tile, not angles)."""
    return _angle_rows(cfg, norm, interpret, ANGLE_FULL_ROWS)


@functools.lru_cache(maxsize=256)  # (a Config's replace costs tens of µs: once per config)
def _angle_rows(cfg: Config, norm: bool, interpret: bool, full_rows: bool) -> Config:
    if not (full_rows and cfg.angles and not norm and not interpret and cfg.product == "gather"
            and cfg.x_dtype != torch.float32 and cfg.block_d <= 128):
        return cfg
    return replace(cfg, block_r=2 * cfg.block_r)


def gather_groups(cfg: Config, n_t: int, q_heads: int, k_heads: int, num_sms: int, *, heads: int | None = None,
                  norm: bool = False, interpret: bool = False) -> tuple[Config, int, int, int]:
    """A gather launch's tile and head groups over ``n_t`` rows: ``(config, heads per program, KG,
    groups)``, ``head_groups`` for ``cfg``'s rows; angles at ``angle_rows``' wide tile where neither
    tile makes the launch a SEAM build (KG > 0: the decode step's, which keeps ``cfg``)."""
    apart = cfg.product == "gather"
    if not apart and heads is None:  # (the dot: each program's prologue counted, dot_heads_per_program)
        heads = dot_heads_per_program(cdiv(n_t, cfg.block_r), q_heads + k_heads, num_sms * dot_programs_per_sm(cfg))
    groups = head_groups(cdiv(n_t, cfg.block_r), q_heads, k_heads, num_sms, heads=heads, apart=apart)
    if not cfg.angles or groups[1]:  # (the tables' and the SEAM build's launches: no second look)
        return (cfg, *groups)
    wide = angle_rows(cfg, norm=norm, interpret=interpret)
    if wide is not cfg:
        wide_groups = head_groups(cdiv(n_t, wide.block_r), q_heads, k_heads, num_sms, heads=heads,
                                  apart=apart)
        if wide_groups[1] == 0:
            return (wide, *wide_groups)
    return (cfg, *groups)


HEADS_DOT_MAX_D = 128  # the head-group kernel's dot holds M whole: 32 KB in bf16 at D = 128


PROGRAMS_PER_SM = 8  # the gather grid's target: enough programs that the last wave is short
# the fewest heads a gather program walks (where the launch has them): the loop's first batch
# (gather_depth: 3 for 16-bit x; 4 for bf16 on sm_90 with 4+ heads a program) is then loads of
# real heads, issued together and sharing
# the program's table (or cache) rows. The static model of the decode workload (bf16, sm_90,
# triton 3.9, 800 ns, estimates): apply_qk forward 4.1 -> 2.9 us and apply_qk_at 4.9 -> 3.7 us
# against one head per program (320 programs); backward 4.0 -> 3.8 and 5.0 -> 4.5 us
MIN_HEADS_PER_PROGRAM = 3


@functools.lru_cache(maxsize=1024)  # (every launch asks; a decode step's walks q's group counts)
def heads_per_program(t_tiles: int, heads: int, num_sms: int, q_heads: int | None = None) -> int:
    """Heads a gather program walks (q's then k's, sharing its tables): all of them where the
    T tiles alone give ``PROGRAMS_PER_SM`` programs per SM (the tables are then read once),
    else fewer, evenly, until they do, and never fewer than ``MIN_HEADS_PER_PROGRAM`` (a decode
    step: three heads per program). With ``q_heads`` (of ``heads``: q's and k's apart, as
    ``head_groups`` then splits them) the programs are counted as that split makes them: q's
    groups plus k's. (Counted over both, Llama's 32 + 8 heads on 1,024 T tiles took 20 a program,
    three groups a tile: 3,072 programs where 32, one group each, make 2,048 of the 1,056 wanted;
    by the model, bf16, sm_90, worst end, forward 27.9 -> 25.2 us, backward 25.5 -> 23.2 under
    triton 3.6, 30.1 -> 26.4 and 30.5 -> 26.7 under 3.9: static estimates,
    profiling/results/cpu/gather-heads/)"""
    floor = min(heads, MIN_HEADS_PER_PROGRAM)
    want = PROGRAMS_PER_SM * num_sms
    if q_heads is None or not 0 < q_heads < heads or t_tiles >= want:
        groups = min(heads, max(1, -(-want // max(t_tiles, 1))))
        return max(floor, -(-heads // groups))
    k_heads = heads - q_heads
    for q_groups in range(1, q_heads + 1):  # (the fewest of q's groups, each as even as it can be)
        hb = -(-q_heads // q_groups)
        if t_tiles * (-(-q_heads // hb) + -(-k_heads // hb)) >= want:
            return max(floor, hb)
    return floor


# The head groups' dot: a program's prologue (M, [D, D], read into shared memory, its tables and
# first loads) costs about DOT_PROLOGUE_HEADS heads' time, and with the wide tile (one program an
# SM) nothing hides it: by the model (bf16 D = 128, sm_90, triton 3.6, worst end) 3.7 us against
# 0.83 a head on llama-1d's 64-row tiles (4.5 heads), 4.3 against 0.85 on default's (5.0).
# PROGRAMS_PER_SM's 8 programs an SM gave llama-1d's 40 heads 5 a program, 8 prologues on the
# busiest SM: forward 70.3 us, 68% of an H200's copy; at 40 a program (one wave) 36.7 us, 84%;
# default 16 -> 24 heads a program, forward 195.1 -> 172.3 us, 77 -> 81%
# (profiling/results/cpu/dot-heads/; static estimates)
DOT_PROLOGUE_HEADS = 5
SM_REGISTERS = 65536  # 32-bit registers an NVIDIA SM holds (the token tile's register cap too)


def dot_programs_per_sm(cfg: Config) -> int:
    """Programs of the head groups' dot resident on an SM, by registers (``SM_REGISTERS`` at the
    config's cap, 255 without one, 32 lanes a warp; an estimate on other GPUs): one for the wide
    tile (``dot_wide``), two for 32 rows on 8 warps at 128."""
    return max(1, SM_REGISTERS // ((cfg.maxnreg or 255) * cfg.num_warps * 32))


@functools.lru_cache(maxsize=1024)
def dot_heads_per_program(t_tiles: int, heads: int, slots: int) -> int:
    """Heads a program of the head groups' dot walks over ``t_tiles`` T tiles and ``heads`` heads
    (q's and k's) on ``slots`` resident programs (SMs x ``dot_programs_per_sm``): the groups whose
    waves of (``DOT_PROLOGUE_HEADS`` + heads a program) take the least time, the busiest slot's
    ``ceil(programs / slots)`` programs counted, the fewest groups where two tie; never fewer than
    ``MIN_HEADS_PER_PROGRAM`` (where the launch has them)."""
    def cost(hb: int) -> int:
        return cdiv(t_tiles * cdiv(heads, hb), max(slots, 1)) * (DOT_PROLOGUE_HEADS + hb)

    # (min takes the first least: from every head a program down, the fewest groups)
    return max(min(heads, MIN_HEADS_PER_PROGRAM), min(range(heads, 0, -1), key=cost))


def head_groups(t_tiles: int, q_heads: int, k_heads: int, num_sms: int, *, heads: int | None = None,
                apart: bool = True) -> tuple[int, int, int]:
    """(HB, KG, groups) of a head-group launch (the kernel's ``HB`` and ``KG``, grid axis 1): HB
    heads a program (``heads``, else ``heads_per_program``); where that is every head, one group
    walks q's and then k's (KG 0: the tables read once for both), else q's heads and k's take
    groups of their own (KG: q's groups), so that no program walks from q's last heads into k's.
    A program crossing there issues k's first loads only after q's last heads (its loop's next
    batch ends with q's heads): in a decode step, one program an SM, that program ended a DRAM
    round trip after the others. The split adds at most one group a T tile (3 heads a group for
    32 + 8 heads: 11 + 3 groups, as many as 14 over both). KG > 0 is the kernel's ``SEAM`` build
    (a launch of q alone too: KG its groups); ``apart`` False (the head groups' dot: the seed's
    loop as it was, whose SEAM build spilled 48-64 B in fp16) keeps KG 0."""
    total = q_heads + k_heads
    hb = heads if heads is not None else heads_per_program(t_tiles, total, num_sms, q_heads if apart else None)
    if apart and hb < total:
        kg = -(-q_heads // hb)
        return hb, kg, kg + -(-k_heads // hb)
    return hb, 0, -(-total // hb)


# the norm over a token's heads as the token tile (kernel._token_heads): one token's heads x D held
# in registers as blocks of one power-of-two head count (TOKEN_MAX_BLOCKS at most: the code is
# unrolled per block), the fewest padded heads, about TOKEN_PER_THREAD values a thread over at most
# TOKEN_MAX_WARPS warps (Wan 2.1's 40 x 128: 5 blocks of 8, 10 a thread over 16 warps);
# TOKEN_PROGRAMS_PER_SM persistent programs per SM per tensor (x 16 / warps). Tokens of more than
# TOKEN_MAX_ELEMENTS values (padded) take the head groups' two sweeps
TOKEN_PER_THREAD = 8
TOKEN_MAX_WARPS = 16
TOKEN_MAX_BLOCKS = 8
TOKEN_MAX_ELEMENTS = 8192
TOKEN_PROGRAMS_PER_SM = 2
TOKEN_MAX_REGISTERS = 128  # 16 warps of them fill the register file; a smaller program leaves room for more
# the forward's tile: at most TOKEN_FWD_WARPS warps where a thread then holds at most
# TOKEN_FWD_PER_THREAD values (the swapped pairs': interleave's partner is in x's registers) or
# TOKEN_FWD_PER_THREAD_LOADED (a partner loaded, its offsets held): two programs an SM, each with
# its next token's loads in flight, where one of 16 warps held the SM (Wan 2.1's 40 x 128,
# interleave: 20 values a thread over 8 warps, 128 registers without spill; its forward 76.8 ->
# 88.2% of copy by the model, H100, triton 3.6, not measured: profiling/results/cpu/token-tile-8-warps/;
# the kept pairs spilled 40 B at 16 values). The backward (dy and x, the dw sums: 128 B spilled at
# 8 warps while the token loop's loads were masked) takes 8 only as below
TOKEN_FWD_WARPS = 8
# where the forward's 8 warps compiled without spill under every triton compiled (3.6-3.9; sm_100's
# spilled 16 B under 3.7: TUNED_COMPILER's only). Under another compiler every other arch (sm_86,
# sm_89, sm_120, AMD's: never compiled under 3.7 or 3.8) takes the rounding's warps, more of them
TOKEN_FWD_ARCHS_ANY_COMPILER = (80, 90)
TOKEN_FWD_PER_THREAD = 20
TOKEN_FWD_PER_THREAD_LOADED = 12
# the backward's tile: on TOKEN_BWD_ARCHS at most TOKEN_FWD_WARPS warps where x is 2-byte, its
# pairs swapped, nothing masked (the heads fill the blocks, D a power of two: the kernel's FULL;
# masked, 8 warps spilled 40-88 B) and a thread then holds at most TOKEN_BWD_PER_THREAD values (Wan 2.1's 40 x 128:
# 20 over 8 warps, two programs an SM: 81.5 -> 94.8% of copy by the model, H100, triton 3.6, not
# measured, once no load in the token loop is masked and the offsets are formed where used:
# kernel._token_heads; 128 registers without spill, profiling/results/cpu/token-unmasked/); else
# warps rounded up, at most TOKEN_PER_THREAD values a thread where 16 warps hold them (24 heads x
# 128 on 8 warps, 12 values a thread, spilled 16-88 B under triton 3.6 and 3.9 with a loaded
# partner or fp32 x; on 16, 6, none); fp32 x with a loaded partner at most TOKEN_BWD_WIDE_LOADED
# values, else the head groups' sweeps (40 x 128 at 10 values spilled 24 B under 3.6):
# profiling/results/cpu/token-sign-f0c3bdc/
TOKEN_BWD_WIDE_LOADED = 8
TOKEN_BWD_PER_THREAD = 20
# (sm_80 and sm_100 spilled 16 / 8 B there under triton 3.6: 16 warps; sm_90 56-64 B under 3.7 and
# 3.8: there too only under a TUNED_COMPILER)
TOKEN_BWD_ARCHS = (90,)
# under TRITON_INTERPRET=1 the token tile interprets one token a loop iteration (5-7x the head
# groups' time for a small model's q/k on this CPU): there the launcher takes the head groups
# unless this is set (tests/test_qknorm.py sets it for all its tests; the model tests' tiny
# models take the head groups)
TOKEN_TILE_INTERPRETED = False


def token_tile(heads: int, block_d: int, lanes: int = 32, *, backward: bool, swapped: bool = False,
               wide: bool = False, full: bool = False, arch: int | str | None = None,
               tuned: bool = TUNED_COMPILER) -> tuple[int, int, int, int] | None:
    """(HEADS_B, BLOCKS, warps, register cap) of the token tile for ``heads`` heads of ``block_d``
    (padded) columns: the power of two HEADS_B whose ``BLOCKS = ceil(heads / HEADS_B) <=
    TOKEN_MAX_BLOCKS`` pads the fewest heads (the largest of those), or None where that exceeds
    ``TOKEN_MAX_ELEMENTS`` values. Warps: about ``TOKEN_PER_THREAD`` values a thread, no more
    threads than a block has values, and in the forward (not ``backward``) at most
    ``TOKEN_FWD_WARPS`` where a thread then holds at most ``TOKEN_FWD_PER_THREAD`` values for
    ``swapped`` pairs (src's class PAIRS_SWAPPED), ``TOKEN_FWD_PER_THREAD_LOADED`` else (where
    not ``tuned``, a compiler these were not read off, only on ``TOKEN_FWD_ARCHS_ANY_COMPILER``); in the
    ``backward`` rounded up, then, if ``tuned``, at most ``TOKEN_FWD_WARPS`` on ``TOKEN_BWD_ARCHS`` (``arch``;
    None: no GPU, as sm_90) for swapped pairs of 2-byte x (not ``wide``) whose tile is ``full``
    (both tensors' heads fill the blocks, D a power of two: nothing masked) where a thread then
    holds at most ``TOKEN_BWD_PER_THREAD`` values; the rounding up (at most ``TOKEN_PER_THREAD`` values a thread where
    ``TOKEN_MAX_WARPS`` hold them), and None for ``wide`` x (4 bytes) with a loaded partner past
    ``TOKEN_BWD_WIDE_LOADED`` values a thread. The register cap: ``TOKEN_MAX_REGISTERS``, or the
    register file (64K) over the program's threads where that is less."""
    heads = max(heads, 1)
    best = None
    hb = 1 << (heads - 1).bit_length()  # (triton.next_power_of_2's value: ~6 µs a call, every launch)
    while hb >= 1:
        blocks = -(-heads // hb)
        if blocks <= TOKEN_MAX_BLOCKS and (best is None or blocks * hb < best[0] * best[1]):
            best = (blocks, hb)
        hb //= 2
    blocks, hb = best
    per_token = blocks * hb * block_d
    if per_token > TOKEN_MAX_ELEMENTS:
        return None
    threads = min(TOKEN_MAX_WARPS * 32, per_token // TOKEN_PER_THREAD, hb * block_d)
    most = TOKEN_FWD_PER_THREAD if swapped else TOKEN_FWD_PER_THREAD_LOADED
    arch = 90 if arch is None else arch  # (no GPU: the interpreter, as sm_90)
    if not backward and per_token <= TOKEN_FWD_WARPS * 32 * most \
            and (tuned or arch in TOKEN_FWD_ARCHS_ANY_COMPILER):
        threads = min(threads, TOKEN_FWD_WARPS * 32)
    warps = 1 << (max(1, threads // lanes).bit_length() - 1)
    if backward:  # (the values a thread holds, rounded up: dy, x, g and the dw sums spill sooner)
        most_warps = max(1, min(TOKEN_MAX_WARPS * 32, hb * block_d) // lanes)
        while warps * 2 <= most_warps and per_token > warps * lanes * TOKEN_PER_THREAD:
            warps *= 2
        if wide and not swapped and per_token > warps * lanes * TOKEN_BWD_WIDE_LOADED:
            return None
        if tuned and arch in TOKEN_BWD_ARCHS and swapped and not wide and full and blocks * hb == heads \
                and per_token <= TOKEN_FWD_WARPS * 32 * TOKEN_BWD_PER_THREAD:
            warps = min(warps, max(1, TOKEN_FWD_WARPS * 32 // lanes))
    return hb, blocks, warps, min(TOKEN_MAX_REGISTERS, SM_REGISTERS // (warps * lanes))


@functools.lru_cache(maxsize=1024)  # a pure function of hashable arguments, called every launch
def choose(x_dtype, table_dtype, head_dim: int, *, transpose: bool, gather: bool, exact_in_x: bool,
           exact_in_bf16: bool, interpret: bool = False, positions: int = 0, angles: bool = False,
           product: str = "gather", sin_dtype=None, lanes: int = 32, arch: int | str | None = None) -> Config:
    """The kernel specialisation for these inputs (see the module docstring): the gather kernel
    for a signed permutation (unless ``product="dot"``), else the dot kernel's tiles."""
    if gather and (product == "gather" or triton.next_power_of_2(head_dim) <= HEADS_DOT_MAX_D):
        return choose_gather(x_dtype, table_dtype, head_dim, transpose=transpose, interpret=interpret,
                             positions=positions, angles=angles, sin_dtype=sin_dtype, product=product,
                             lanes=lanes, arch=arch)
    half = x_dtype != torch.float32
    gather_sin = transpose and gather
    if half and exact_in_x and (not transpose or gather_sin):
        split, op, ieee = 1, TL_DTYPE[x_dtype], False  # x (or dy) as it is: exact products
    elif x_dtype == torch.bfloat16 and exact_in_bf16:
        split, op, ieee = 3, tl.bfloat16, False  # general matrix's dy*sin, three bf16 pieces
    elif x_dtype == torch.float32 and exact_in_bf16:
        split, op, ieee = 3, tl.bfloat16, False  # fp32 x as hi + mid + lo
    else:
        split, op, ieee = 1, tl.float32, True
    block_d = max(16, triton.next_power_of_2(head_dim))
    # rows per tile, panel width and warps, read off the compiled kernels (python -m profiling
    # kernels) when the kernel still unrolled every (k, n) block and both tensors: one-piece
    # half-precision dots held a [32, 64] panel in ~180 registers (D <= 128); four panels
    # (D=256) or three pieces needed half the rows; three pieces at D=256 took 8 warps (fp32 x)
    # or 32-wide panels (bf16 dy*sin). The one-body kernel needs fewer registers with the same
    # sizes (bf16 fwd D=128 on sm_90: 156 under the 255 cap below, was 180) and compiles clean
    # for sm_80 and sm_90; the sizes have not been re-chosen (that wants a GPU's timings).
    if ieee:  # FMA dots: [16, 32] panels over 4 warps (8 waves of 64 lanes on AMD): 8 warps took
        # 255 registers and kept 8 B of stack at D = 80-128 forward (fp32 tables) on sm_80/86/89
        # under triton 3.6 and 3.7.1 (133-136 registers, one program an SM, under 3.8/3.9); 4 take
        # 96-118 forward, 112-185 backward, no stack on sm_80-sm_120 under 3.6-3.9, 3-4 programs
        # an SM at D = 80-128 (profiling/results/cpu/gate-36-39/; not timed on a GPU, sm_90 either)
        block_r, block_n, num_warps = 16, 32, (4 if lanes == 32 else 8)
    elif split == 1:
        block_r, block_n, num_warps = (32 if block_d <= 128 else 16), PANEL, 4
    elif block_d <= 128:
        block_r, block_n, num_warps = 16, PANEL, 4
    elif x_dtype == torch.float32:  # fp32 x in three pieces at D=256
        block_r, block_n, num_warps = 16, PANEL, 8
    else:  # a general bf16 matrix's backward at D=256: 64-wide panels spilled on sm_80/sm_90
        block_r, block_n, num_warps = 16, 32, 4
    if angles:  # the angle arithmetic holds ~40 more fp32 values per element: half the rows
        # (full tiles spilled 8-224 B in 12 of 36 sm_90 configs) but never under MIN_ROWS (8-row
        # tiles do not compile on triton 3.2-3.4), and the warps that compile without spill on
        # sm_80, sm_90 and sm_100: 8 for fp32 x, D=256 and every backward (the one-body kernel's
        # half-precision multi-axis backward at 4 warps took 206-231 registers on sm_80/sm_90 and
        # spilled 40-56 B on sm_100; at 8, 163-186 and none)
        block_r = max(block_r // 2, MIN_ROWS)
        if x_dtype == torch.float32 or block_d > 128 or transpose:
            num_warps = max(num_warps, 8)
    # The register ceiling is explicit at 255 (256 threads x 255 fill the 64K register file, so
    # no 8-warp block loses occupancy to it): left to itself, ptxas aimed at 128 registers and
    # spilled one 8-byte value (stored before the tile loop, reloaded every tile) in 32 of the
    # 460 sm_80/sm_90 builds of the one-tile-body kernel; told it may use 255, it spilled none.
    # (fp32 x's angles once had caps of 168/224 at 8-row tiles; at 16 rows 168 spilled 16-80 B
    # in the backward on sm_90/sm_100.)
    maxnreg = 255
    return Config(
        x_dtype=x_dtype, table_dtype=table_dtype, head_dim=head_dim, transpose=transpose,
        gather_sin=gather_sin, split=split, op_dtype=op, fp32_dot=ieee or interpret,
        block_r=_INTERPRET_BLOCK_R if interpret else block_r, block_d=block_d,
        block_n=min(block_n, block_d),
        raw_x=interpret and x_dtype == torch.bfloat16, raw_t=interpret and table_dtype == torch.bfloat16,
        raw_s=interpret and (sin_dtype or table_dtype) == torch.bfloat16,
        sin_dtype=None if sin_dtype in (None, table_dtype) else sin_dtype,
        num_warps=num_warps, positions=positions, angles=angles, maxnreg=maxnreg, permutation=gather,
    )


MAX_TUNED_WARPS = 8  # 256 threads at up to 255 registers each fill an SM's 64K registers


@functools.lru_cache(maxsize=1024)
def candidates(cfg: Config, *, interpret: bool = False, tuned: bool = TUNED_COMPILER) -> tuple[Config, ...]:
    """The configs the GPU autotuner times for ``cfg`` (``choose``'s result), ``cfg`` first: for the
    gather kernel (no dot, so no bit depends on the tile) the same work a thread in programs of
    half and of twice the size (half the rows on half the warps, twice the rows on twice the warps,
    at most ``MAX_TUNED_WARPS``), for fp32 tables and one-axis positions (what models launch); only
    ``cfg`` under the interpreter, for other tables, several axes, angles (their tile is sized to
    compile without spill) and for the dot kernel (general matrices, and rotation matrices where
    ``product("dot")`` asks). A thread's code and registers are the chosen tile's, so the three
    are near each other: by the model (sm_90, triton 3.6, worst end, rome.apply_qk of default,
    llama-1d and wan, bf16 and fp32) within 3.7 points of the chosen one on an H200, 1.7 on an H100,
    where half the rows and twice the warps (a thread's work halved) were 4.5-22 points below it
    on an H200 (profiling/results/cpu/tuned-candidates/): a slow candidate the timing could pick.
    Not ``tuned`` (a compiler the tiles were not read off: ``TUNED_COMPILER``): fp32 x without
    twice the program (it spilled under triton 3.8)."""
    if interpret or cfg.product != "gather" or cfg.angles or cfg.positions == 2 \
            or (cfg.positions == 0 and cfg.table_dtype != torch.float32):
        return (cfg,)
    alts = []
    if cfg.num_warps >= 2 and cfg.block_r >= 2:  # half the program
        alts.append(replace(cfg, block_r=cfg.block_r // 2, num_warps=cfg.num_warps // 2))
    # twice the program (fp32 x's under a compiler not TUNED_COMPILER: under triton 3.8 two of
    # sm_80's spilled 8 B, the backward at D=64, 32 rows on 8 warps)
    if 2 * cfg.num_warps <= MAX_TUNED_WARPS and (tuned or cfg.x_dtype != torch.float32):
        alts.append(replace(cfg, block_r=2 * cfg.block_r, num_warps=2 * cfg.num_warps))
    return (cfg, *alts)


def tile_name(cfg: Config) -> str:
    return f"BLOCK_R={cfg.block_r} warps={cfg.num_warps}"


@dataclass(frozen=True, eq=False)
class Plan:
    config: Config  # choose()'s: the launch when nothing is tuned
    candidates: tuple  # the configs the autotuner may pick from (config first; same block_n)
    operand: torch.Tensor  # M in the dot's operand dtype (exact: choose() checked it)
    nz: int  # bit n*NP + k set where block (k, n) of the dot's matrix is nonzero
    src: torch.Tensor  # int32: the gather kernel's [D + 1] (gather_index), gather_sin's [D], else a dummy [1]
    sign: torch.Tensor | None = None  # the gather kernel: fp32 [D], the sign of each gathered column
    pair: int = 0  # the gather kernel: src's pair class (PAIRS_*, also at src[D]), known on the host
    arch: int | str | None = None  # current_arch() when planned: the GPU the launch is chosen for
    run: int = 1  # the gather kernel: src's kept_run (the runs of columns it moves whole)
    halves: bool = False  # the gather kernel: src is the whole head's half rotation (``is_halves``)
    pairs: torch.Tensor | None = None  # the gather kernel: src's pairs as HALVES_RUN builds read them
    # (``halves_pairs``: acol, bcol, the class), None where src does not pair every column
    pairs_run: int = 0  # their runs (HALVES_RUN), 0 where pairs is None

    def reads(self, n: int, k: int) -> bool:
        """Whether output panel n reads input panel k (block (k, n) of the dot's matrix)."""
        np_ = self.config.block_d // self.config.block_n
        return bool((self.nz >> (n * np_ + k)) & 1)


def _block_mask(nonzero: torch.Tensor, block: int, block_d: int) -> int:
    """Bitmask of the nonzero [block, block] blocks of a boolean [D, D] padded to the kernel's
    BLOCK_D: bit n*NP + k for block (k, n), NP = BLOCK_D // block panels, so output panel n's
    bits lie together (the kernel's indexing; for D not a power of two there are more panels
    than ceil(D / block))."""
    d = nonzero.shape[0]
    np_ = block_d // block
    pad = torch.zeros(np_ * block, np_ * block, dtype=torch.bool)
    pad[:d, :d] = nonzero
    blocks = pad.reshape(np_, block, np_, block).any(3).any(1)
    return sum(1 << (n * np_ + k) for k in range(np_) for n in range(np_) if blocks[k, n])


@functools.lru_cache(maxsize=256)
def _exact_in_dtype(info, matrix, dtype) -> bool:
    """Whether the matrix's values are exact in ``dtype`` (once per matrix and dtype)."""
    return _exact_in(matrix.detach(), dtype)


@functools.lru_cache(maxsize=256)
def _nonzero_blocks(info, matrix, transpose: bool, block: int, block_d: int) -> int:
    """The block mask of M (or Mᵀ), once per matrix, pass and panel width."""
    nonzero = matrix.detach().to("cpu") != 0
    return _block_mask(nonzero.T if transpose else nonzero, block, block_d)


@functools.lru_cache(maxsize=256)
def _gather_src(info):
    """int32 [D] on the matrix's device: column j of Mᵀ is row j of M, whose nonzero sits at
    column index_t[j] (MatrixInfo keeps it on the matrix's device)."""
    return info.index_t.to(torch.int32)


_gather_tile: ThreadSetting[tuple | None] = ThreadSetting(None)


@contextlib.contextmanager
def gather_tile(block_r: int | None = None, num_warps: int | None = None, maxnreg: int | None = None):
    """Launch the gather kernel (``product="gather"``) in this thread with these tile rows, warps
    and register cap in place of ``choose``'s and the autotuner's (None: keep that field), for
    timing them on a GPU (``python -m profiling.bench_kernel --sweep``). The bits are the same
    (no gather bit depends on the tile); a tile the static gate never compiled may spill."""
    for name, v in (("block_r", block_r), ("num_warps", num_warps), ("maxnreg", maxnreg)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive int or None, got {v!r}")
    with _gather_tile.scoped((block_r, num_warps, maxnreg)):
        yield


def _overridden(cfg: Config) -> Config | None:
    tile = _gather_tile.get()
    if tile is None or cfg.product != "gather":
        return None
    block_r, num_warps, maxnreg = tile
    return replace(cfg, block_r=block_r or cfg.block_r, num_warps=num_warps or cfg.num_warps,
                   maxnreg=maxnreg or cfg.maxnreg)


def plan(matrix: torch.Tensor, x_dtype, table_dtype, *, transpose: bool, interpret: bool,
         positions: int = 0, angles: bool = False, sin_dtype=None) -> Plan:
    """Config, block mask and gather index for one launch (host work cached per matrix).
    ``positions``: 0 (per-row tables), 1 (one position axis) or 2 (several); ``sin_dtype``: sin's
    dtype where it is not cos's (``table_dtype``)."""
    info = describe(matrix)
    arch = current_arch(matrix.device if matrix.is_cuda else None)
    cfg = choose(x_dtype, table_dtype, matrix.shape[0], transpose=transpose, gather=info.gather,
                 exact_in_x=_exact_in_dtype(info, matrix, x_dtype), exact_in_bf16=info.bf16_exact,
                 interpret=interpret, positions=positions, angles=angles, product=current_product(),
                 sin_dtype=sin_dtype, lanes=warp_size(),
                 arch=arch)
    if cfg.product == "gather":
        src, sign, pair, run = _signed_gather(info, transpose)
        halves = _halves(info, transpose)
        pairs, pairs_run = (None, 0) if halves else _halves_pairs(info, transpose)
        fixed = None if interpret else _overridden(cfg)
        if fixed is not None:  # gather_tile(): this tile, not tuned
            return Plan(fixed, (fixed,), matrix, 0, src, sign, pair, arch, run, halves, pairs, pairs_run)
        return Plan(cfg, candidates(cfg, interpret=interpret), matrix, 0, src, sign, pair, arch, run, halves, pairs,
                    pairs_run)
    if cfg.heads:  # the dot in the head-group kernel: M whole, src for the transpose's sin
        src, sign, pair, run = _signed_gather(info, transpose)
        op = operand_dtype(cfg)
        operand = matrix if matrix.dtype == op else _converted(info, matrix, op)
        return Plan(cfg, candidates(cfg, interpret=interpret), operand, 0, src, sign, pair, arch, run)
    nz = _nonzero_blocks(info, matrix, transpose, cfg.block_n, cfg.block_d)
    src = _gather_src(info) if cfg.gather_sin else _dummy(matrix.device)
    op = operand_dtype(cfg)
    operand = matrix if matrix.dtype == op else _converted(info, matrix, op)
    return Plan(cfg, candidates(cfg, interpret=interpret), operand, nz, src, arch=arch)


PAIRS_NONE, PAIRS_KEPT, PAIRS_SWAPPED = 0, 1, 2  # kernel.PAIRS_*: how src moves column pairs


def pair_class(src: torch.Tensor) -> int:
    """How the gather index ``src`` ([D] ints) moves the column pairs (2i, 2i + 1), which decides
    how the gather kernel reads the partner ``x[:, src]``: ``PAIRS_SWAPPED`` where src[j] == j ^ 1
    for every j (interleave: the partner is in x's own registers), ``PAIRS_KEPT`` where every pair
    lands on a pair in order (src[2i] even, src[2i+1] == src[2i] + 1: the half rotation of sections
    of a multiple of 4 columns, pass-through columns; one load per run of ``kept_run`` columns,
    a pair's 4 or 8 bytes at least), else
    ``PAIRS_NONE`` (one load per element)."""
    s = [int(v) for v in src.tolist()]
    d = len(s)
    if d % 2:
        return PAIRS_NONE
    if all(v == (j ^ 1) for j, v in enumerate(s)):
        return PAIRS_SWAPPED
    if all(s[j] % 2 == 0 and s[j + 1] == s[j] + 1 for j in range(0, d, 2)):
        return PAIRS_KEPT
    return PAIRS_NONE


# positions on several axes: up to MAX_ROW_AXES of them, a row's positions read once an axis and a
# column's picked in registers (kernel._by_axis). Read per element, ptxas issued each position's
# load just before the cache rows' loads that wait on it: a DRAM round trip an element in the
# program's prologue. By the model (sm_90, worst end, H100 / H200), apply_qk_at's forward on
# default: 92.1 / 81.9 -> 95.5 / 88.6% of copy (triton 3.6), 94.2 / 85.8 -> 96.0 / 89.7 (3.9);
# wan and hunyuan-video's +1-6 points (profiling/results/cpu/positions-by-row/). The gather's
# backward too, since its cache rows are read as the axis's runs in x's layout and sin at src's
# out-of-range NaN is folded into the sign (kernel._row_tables; before, the row read cost it
# 0.8-1.7 points under triton 3.9) (profiling/results/cpu/axis-runs/). The dot's backward keeps
# the per-element read, and so does the head groups' dot on AMD: its gfx942 builds spilled 1-9
# SGPRs with it (triton 3.9)
MAX_ROW_AXES = 4


def position_axes(positions: int, axes: int, transpose: bool, product: str = "gather",
                  arch: int | str | None = None) -> int:
    """The gather kernel's ``AXES`` for ``positions`` (0, 1 or 2: ``Config.positions``) on ``axes``
    position axes (``positions.shape[-1]``): that count where ``positions`` is 2 and it is at most
    ``MAX_ROW_AXES``, but for the dot (``product``) on an AMD ``arch`` or in its ``transpose``; else
    0 (the per-element read). (The launcher also gives 0 to the norm's backward epilogue and to
    the angles' transpose.)"""
    if product == "dot" and (arch in HIP_ARCHS or transpose):
        return 0
    return axes if positions == 2 and 2 <= axes <= MAX_ROW_AXES else 0


def launch_axis_run(run: int, axes: int, angles: bool, *strides: int) -> int:
    """The gather kernel's ``AXIS_RUN``: ``run`` (``rome.positions.axis_run`` of the launch's axis,
    which the op read on the host) where the build reads positions by row (``AXES`` > 0) from
    caches (not ``angles``) whose row ``strides`` are multiples of it (the vectors then start at
    multiples of it; else the largest power of two dividing them), else 1. The kernel reads a
    row's runs as run-wide vectors: a wrong run reads wrong columns on a GPU."""
    if axes == 0 or angles or run not in AXIS_RUNS:
        return 1
    while run > 1 and any(st % run for st in strides):
        run //= 2
    return run


KEPT_RUNS = (2, 4, 8)  # the runs kept_run looks for (8 bf16 / fp16 or 4 fp32 columns: 16 B, one load)


def kept_run(src: torch.Tensor) -> int:
    """The longest run n of ``KEPT_RUNS`` in which the gather index ``src`` ([D] ints) moves
    columns whole: every n columns from a multiple of n are read from n consecutive columns from a
    multiple of n (``src[j] % n == 0`` and ``src[j + i] == src[j] + i`` for ``j % n == 0``, D a
    multiple of n); 1 where pairs are not kept (n = 2 holds exactly where ``pair_class`` is
    PAIRS_KEPT). A half rotation whose halves are multiples of 8 columns gives 8 (llama's whole
    head: src[j] = (j + D/2) % D; a rotary part of 16, 32, 64 columns); halves of 4 mod 8 give 4
    (D = 40, a rotary part of 24); sections whose halves are not multiples of 4 give 2 (default's
    44/44/40: 22-column halves). The gather kernel's PAIRS_KEPT partner loads are
    ``launch_kept_run`` elements wide, which the compiler is told: a wrong run would read wrong
    columns on a GPU. ``_signed_gather`` builds src from each run's first column, so a wrong run
    gives wrong values everywhere, the interpreter's tests too."""
    s = [int(v) for v in src.tolist()]
    d, best = len(s), 1
    for n in KEPT_RUNS:  # (runs of 2n from multiples of 2n are runs of n from multiples of n)
        if d % n or any(s[j] % n or s[j:j + n] != list(range(s[j], s[j] + n)) for j in range(0, d, n)):
            break
        best = n
    return best


def launch_kept_run(plan: Plan, x_dtype, norm_grad: bool = False) -> int:
    """The gather kernel's ``KEPT_RUN`` for ``plan``'s src and x's dtype: 16 bytes of x (one
    vector load) where its kept_run reaches that and the gather reads a PAIRS_KEPT partner, else 2 (unused
    there: the same build for every such matrix). ``norm_grad`` (the transpose with the norm's
    backward as its epilogue, at up to 168 registers): 2, the pairs as before (with runs of 8
    ptxas put fp16's LayerNorm backward into 8 B of stack on sm_90 under triton 3.6)."""
    if plan.pair != PAIRS_KEPT or plan.config.product == "dot" or norm_grad:
        return 2
    wide = 16 // x_dtype.itemsize  # (a run narrower than 16 bytes: pairs, one build fewer; runs of
    # 4 in fp16 put its forward into 8 B of stack on sm_90 under triton 3.9)
    return wide if plan.run >= wide else 2


def is_halves(src: torch.Tensor) -> bool:
    """Whether the gather index ``src`` ([D] ints) is the half rotation of the whole head,
    ``src[j] == (j + D/2) % D`` (llama's and NeoX's rotate_half, either pass): each column's
    partner is in the other half, which the gather kernel's ``HALVES`` build reads as the head's
    two halves (``halves_config``)."""
    d = src.shape[0]
    return d >= 2 and d % 2 == 0 and torch.equal(src.to(torch.int64).cpu(), (torch.arange(d) + d // 2) % d)


@functools.lru_cache(maxsize=256)
def _halves(info, transpose: bool) -> bool:
    return is_halves(info.take_t if transpose else info.take)


def halves_pairs(src: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """The pairs of a gather index ``src`` ([D] ints) that pairs every column with another
    (``src[src[j]] == j != src[j]``: each axis's half rotation of its own section, as default's
    44/44/40; interleave), D a power of two: int32 ``[D]``, the pairs' first columns
    ``acol`` (ascending) then their partners ``bcol = src[acol]``, and the run n of ``KEPT_RUNS``
    in which both move whole (``acol[i:i+n]`` and ``bcol[i:i+n]`` n consecutive columns from
    multiples of n, for i a multiple of n: the loads' width, which the kernel tells the compiler),
    or None where src does not pair every column or no run of 2 holds (interleave's pairs: its
    partner form swaps them in registers). The gather kernel's ``HALVES`` build with
    ``HALVES_RUN`` = n holds a head as ``x[:, acol]`` and ``x[:, bcol]``, each the other's
    partner (default's 22-column halves: runs of 2)."""
    s = [int(v) for v in src.tolist()]
    d = len(s)
    if d < 4 or d & (d - 1) or any(not 0 <= v < d or v == j or s[v] != j for j, v in enumerate(s)):
        return None
    acol = [j for j in range(d) if s[j] > j]
    bcol = [s[j] for j in acol]
    best = 0
    for n in KEPT_RUNS:
        if any(c[i] % n or c[i:i + n] != list(range(c[i], c[i] + n)) for c in (acol, bcol)
               for i in range(0, d // 2, n)):
            break
        best = n
    if not best:
        return None
    return torch.tensor(acol + bcol, dtype=torch.int32), best


@functools.lru_cache(maxsize=256)
def _halves_pairs(info, transpose: bool):
    """(int32 ``[D + 1]`` on the matrix's device: ``halves_pairs``'s columns then src's pair
    class, as the kernel's src_ptr; the run), or (None, 0)."""
    take = info.take_t if transpose else info.take
    found = halves_pairs(take.cpu())
    if found is None:
        return None, 0
    cols, run = found
    cls = torch.tensor([pair_class(take.cpu())], dtype=torch.int32)
    return torch.cat([cols, cls]).to(take.device), run


# the HALVES build (kernel._halves_heads) where halves_config allows it (partner_form(): not in a
# thread's block)
HALVES = True
HALVES_DTYPES = (torch.bfloat16, torch.float16)
HALVES_ARCHS = (90, None)  # (None: no GPU, the interpreter, as sm_90; sm_80 and sm_100 spilled 24-40 B)
HALVES_MAX_D = 128  # (D = 256 spilled 8 B under triton 3.6, sm_90)
# heads a batch by x's dtype (the kernel holds at most six): bf16 three (four spilled 8-16 B at 128
# registers, sm_90, triton 3.6 and 3.9), fp16 two (its sum is _dot2's: three spilled 8 B)
HALVES_DEPTH = {torch.bfloat16: 3, torch.float16: 2}
# the pairs' (HALVES_RUN > 0: the partner form's rows, loads of the run's width; the kernel holds at
# most six): by the model (default's 44/44/40, sm_90, 128 registers, no spill under triton 3.6 and
# 3.9, H200 at the worst end) bf16 four 94.5-94.8%, six 95.3-95.5 (four at 96 registers, five
# programs an SM: 95.1-95.2; at 80, 8 B spilled); fp16 (_dot2's sum, issue-bound) two 82.1, three
# 84.2-84.8; fp32 (not the whole head's: its partner form is at 95-96) three 97.3-97.5 (four: 328 B
# spilled) (profiling/results/cpu/pairs/). Its keys: the dtypes the pairs take. Under a compiler not
# TUNED_COMPILER, PAIRS_DEPTH_OTHER's where it has the dtype: bf16 four (under triton 3.8 six spilled
# 32 B with positions on several axes, five 8 B in more builds; four none, nor under 3.7)
PAIRS_DEPTH = {torch.bfloat16: 6, torch.float16: 3, torch.float32: 3}
PAIRS_DEPTH_OTHER = {torch.bfloat16: 4}


def halves_depth(plan: Plan, x_dtype, tuned: bool = TUNED_COMPILER) -> int:
    """Heads a batch of ``plan``'s HALVES build: the whole head's halves ``HALVES_DEPTH``, the
    pairs' ``PAIRS_DEPTH`` (``PAIRS_DEPTH_OTHER``'s where it has x's dtype, if not ``tuned``:
    a compiler the choice was not read off)."""
    if plan.halves:
        return HALVES_DEPTH[x_dtype]
    return PAIRS_DEPTH[x_dtype] if tuned else PAIRS_DEPTH_OTHER.get(x_dtype, PAIRS_DEPTH[x_dtype])


_partner_form = ThreadSetting(False)


@contextlib.contextmanager
def partner_form():
    """Launch the whole head's half rotation in the gather kernel's partner form (x and
    ``x[:, src]`` a head) in this thread, where ``halves_config`` would take its halves: the
    static gate compiles both (the partner form's build with runs of 8 is a partial rotary's too).
    The bits are the same. A forward's backward takes the same form (``rome.ops``), also where
    autograd runs it in another thread (on a GPU) or outside the block."""
    with _partner_form.scoped(True):
        yield


# the sections' pairs as halves (HALVES_RUN): off unless a thread asks (pairs_halves()). Measured on
# an H200 under triton 3.6 (profiling/results/h200/ab-pairs-a8e7b9b/: the same tree, the partner
# form against the pairs, two rounds), default's 44/44/40, apply_qk forward / backward % of copy:
# bf16 91.6-92.0 / 90.9 -> 89.9-90.0 / 89.4-89.8, fp32 93.3-93.4 / 93.8-94.0 -> 88.0-88.3 /
# 88.2-88.6, fp16 86.0 / 85.9-86.0 -> 81.6-81.8 / 81.8-82.0: slower in every dtype, where the
# bandwidth model said 2-4 points faster (profiling/results/cpu/pairs/). Kept for the model's
# check and the static gate, not launched by default
_pairs_halves = ThreadSetting(False)


@contextlib.contextmanager
def pairs_halves(on: bool = True):
    """Launch sections' half rotations as their pairs (``HALVES_RUN``, ``halves_pairs``) in this
    thread where ``halves_config`` allows it (``on``), or in the partner form (not ``on``, as outside
    such a block: slower on an H200). The bits are the same."""
    with _pairs_halves.scoped(bool(on)):
        yield


def takes_pairs() -> bool:
    """Whether launches in this thread take the sections' pairs as halves (``pairs_halves``)."""
    return _pairs_halves.get()


_STATE = (_product, _partner_form, _pairs_halves)  # (launch_state's settings, in its order)


def launch_state() -> tuple[str, bool, bool]:
    """This thread's choices a forward hands its backward (``rome.ops``, where autograd may run it
    in another thread): the product, the partner form, the pairs as halves. (Each op's forward
    under grad asks: the values read directly, no call a setting.)"""
    p, f, h = _STATE
    return (getattr(p._local, "value", p._default), getattr(f._local, "value", f._default),
            getattr(h._local, "value", h._default))


class launch_state_scoped:
    """A block in which this thread's launches take ``state`` (``launch_state``'s); the values
    before it are put back after it, exceptions too. A class, not three nested ``scoped`` blocks:
    every backward of an op enters one."""

    __slots__ = ("state", "old")

    def __init__(self, state: tuple[str, bool, bool]):
        self.state = state

    def __enter__(self):
        self.old = launch_state()
        p, f, h = _STATE
        p._local.value, f._local.value, h._local.value = self.state

    def __exit__(self, *exc):
        p, f, h = _STATE
        p._local.value, f._local.value, h._local.value = self.old
        return False


def halves_config(plan: Plan, x_dtype, *, norm: bool = False, native: bool = False,
                  interpret: bool = False, axes: int = 0) -> Config | None:
    """The gather kernel's ``HALVES`` tile for ``plan``, or None where the launch keeps the
    partner form: ``plan``'s src is the whole head's half rotation (``is_halves``) or pairs its
    columns in runs of 2 or more (``halves_pairs``: sections' half rotations, default's; only inside
    ``pairs_halves()``: measured slower), D a power of
    two, tables per T row or a cache at one position per row (the pairs in runs of 2 also at
    positions on several axes read by row: ``axes``, the launch's ``position_axes``; runs of 8
    spilled 8 B there in bf16 under triton 3.6), no angles, 16-bit x (the pairs'
    fp32 too: ``PAIRS_DEPTH``'s keys) on sm_90 (``HALVES_DTYPES``, ``HALVES_ARCHS``), D <=
    ``HALVES_MAX_D``, no fused norm (``norm``), not ``rounding="native"`` (``native``), the gather product. The whole head's:
    twice ``choose``'s rows (a thread holds a head's elements once, not with a partner copy: the
    same registers); the pairs': ``choose``'s rows, their loads as narrow as the partner's, more
    heads a batch (``halves_depth``); under the interpreter, and under ``gather_tile()`` (the tile
    given is the halves' tile), its rows. By the model (rome.apply_qk of llama-1d, bf16, sm_90,
    worst end, H100 / H200 % of copy): triton 3.6 forward 97.6 / 93.4 -> 98.9 / 96.9, backward
    98.1 / 94.7 -> 99.0 / 97.2; triton 3.9 97.2 / 92.6 -> 98.9 / 97.0, 97.2 / 92.4 -> 98.8 / 96.7;
    H200 44.4 -> 42.8 us; fp16 (two heads a batch) on the H200 80.2 / 82.1 -> 89.4 / 87.2 (3.6),
    80.2 / 82.3 -> 89.0 / 89.2 (3.9) (static estimates, profiling/results/cpu/halves/); default's
    pairs: profiling/results/cpu/pairs/."""
    cfg = plan.config
    if not (HALVES and (plan.halves or (plan.pairs is not None and takes_pairs())) and plan.arch in HALVES_ARCHS and not _partner_form.get()
            and cfg.product == "gather" and not cfg.angles
            and x_dtype in (HALVES_DTYPES if plan.halves else PAIRS_DEPTH)
            and (cfg.positions in (0, 1) or (cfg.positions == 2 and plan.pairs_run == 2 and axes > 0))
            and cfg.head_dim == cfg.block_d <= HALVES_MAX_D and not norm and not native):
        return None
    return _halves_tile(cfg, interpret or _gather_tile.get() is not None or not plan.halves)


def halves_walk(heads: int, interpret: bool = False) -> bool:
    """Whether a launch whose programs walk ``heads`` heads takes its ``halves_config``: where
    they walk more than ``MIN_HEADS_PER_PROGRAM`` (a batch or more, so the loop's prefetch keeps
    heads in flight); a decode step's three heads a program keep the SEAM build, whose time is its
    prologue's round trips (the model, bf16, sm_90, worst end: 1.9 us forward where the halves'
    twice the rows a program took 2.8). Under the interpreter (three heads a program) always, so
    the tests run it."""
    return interpret or heads > MIN_HEADS_PER_PROGRAM


@functools.lru_cache(maxsize=256)  # (every such launch asks)
def _halves_tile(cfg: Config, interpret: bool) -> Config:
    return cfg if interpret else replace(cfg, block_r=2 * cfg.block_r)


@functools.lru_cache(maxsize=256)
def halves_candidates(cfg: Config, interpret: bool = False, fixed: bool = False) -> tuple[Config, ...]:
    """``candidates`` of a ``halves_config`` tile but the half-size program (8 rows on 2 warps
    spilled 8 B under triton 3.6, sm_90, D = 128); ``fixed`` (a plan of one candidate:
    ``gather_tile()``, the interpreter, the pairs of fp32 x: ``halves_fixed``): ``cfg`` alone.
    Cached: every such launch asks."""
    if fixed:
        return (cfg,)
    return tuple(c for c in candidates(cfg, interpret=interpret) if c.num_warps >= cfg.num_warps)


def halves_fixed(pairs: bool, x_dtype) -> bool:
    """Whether a HALVES build is not tuned: the ``pairs``' (``HALVES_RUN`` > 0) of fp32 x (the tuning
    candidate of 32 rows on 8 warps spilled 8 B at D = 64 under triton 3.9, sm_90)."""
    return pairs and x_dtype == torch.float32


def gather_index(take: torch.Tensor, cls: int | None = None) -> torch.Tensor:
    """The gather kernel's ``src``: int32 ``[D + 1]``, ``take`` then its ``pair_class`` at [D]
    (``cls``: that class where the caller has it)."""
    cls = torch.tensor([pair_class(take.cpu()) if cls is None else cls], dtype=torch.int32, device=take.device)
    return torch.cat([take.to(torch.int32), cls])


@functools.lru_cache(maxsize=256)
def _signed_gather(info, transpose: bool):
    """int32 src ``[D + 1]`` (``gather_index``: the gather then how it moves pairs), fp32 sign [D]
    of ``x @ M`` (or ``y @ Mᵀ``) as a signed column gather, on the matrix's device (output column j
    is ``sign[j] * x[src[j]]``; a zero column: sign 0, src j), the pair class and the kept run
    (ints)."""
    take, sign = (info.take_t, info.sign_t) if transpose else (info.take, info.sign)
    cls = pair_class(take.cpu())
    run = kept_run(take.cpu())
    if run >= 2:  # src as the kernel's runs read it (each run's first column + j % run): the same
        # values where the run holds; where it did not, the result is wrong on every backend
        j = torch.arange(take.shape[0], device=take.device)
        take = take[j - j % run] + j % run
    return gather_index(take, cls), sign.to(torch.float32).contiguous(), cls, run


def operand_dtype(cfg: Config) -> torch.dtype:
    """The torch dtype the matrix is handed to the kernel in: the dot's operand dtype."""
    return {tl.bfloat16: torch.bfloat16, tl.float16: torch.float16, tl.float32: torch.float32}[cfg.op_dtype]


@functools.lru_cache(maxsize=256)
def _converted(info, matrix, dtype):
    return matrix.detach().to(dtype)


@functools.lru_cache(maxsize=16)
def _dummy(device):
    return torch.zeros(1, dtype=torch.int32, device=device)


def uses_fp32_dot(x_dtype, matrix: torch.Tensor) -> bool:
    """True where half-precision x would multiply in IEEE fp32 (the matrix is not exact in x's
    dtype, or bf16): slower than the tensor-core path; ops.py warns once."""
    info = describe(matrix)
    cfg = choose(x_dtype, x_dtype, matrix.shape[0], transpose=False, gather=info.gather,
                 exact_in_x=_exact_in_dtype(info, matrix, x_dtype), exact_in_bf16=info.bf16_exact)
    return cfg.fp32_dot


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device) -> int:
    """SMs of a CUDA device."""
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def max_programs(device, *, interpret: bool, num_sms: int | None = None) -> int:
    """The dot kernel's persistent grid: at most this many programs (``num_sms``: the device's
    SMs where given, e.g. when a launch is captured on the CPU)."""
    if interpret:
        return _INTERPRET_PROGRAMS
    return (num_sms or globals()["num_sms"](device)) * _PROGRAMS_PER_SM


# --- every configuration, for the ahead-of-time inspection (python -m profiling kernels) ---------

HEAD_DIMS = (64, 80, 96, 128, 256)
_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}


@dataclass(frozen=True)
class KernelConfig:
    """A launch as Triton's JIT would specialise it, for compiling ahead of time."""

    name: str
    fn: object  # the @triton.jit kernel
    signature: dict  # non-constexpr arg -> triton type
    constexprs: dict  # constexpr args and ints specialised to 1 -> value
    divisible_by_16: tuple  # args a real launch marks tt.divisibility=16
    num_warps: int
    num_stages: int
    meta: dict
    options: dict  # extra compile options of the launch (enable_fp_fusion=False)


def _matrix_kinds(x_dtype, transpose):
    """(label, gather, exact_in_x, exact_in_bf16, nz) of the matrices a launch can see: a rotation
    matrix (dense block mask, the worst case) and, where it changes the code, a general one."""
    kinds = [("rotation", True, True, True)]
    if transpose and x_dtype == torch.bfloat16:
        kinds.append(("general bf16-exact", False, True, True))
    kinds.append(("general", False, False, False))
    return kinds


def dot_kernel_config(cfg: Config, matrix_kind: str, suffix: str = "") -> KernelConfig:
    """The dot kernel's launch for ``cfg`` as a BNSD q/k launch specialises it, with every block of
    the matrix nonzero (the most work)."""
    fn = kernel._rome_kernel
    np_ = cfg.block_d // cfg.block_n
    constexprs = dict(
        POSITIONS=cfg.positions, ANGLES=cfg.angles, TRANSPOSE=cfg.transpose, GATHER_SIN=cfg.gather_sin, NZ=(1 << np_ * np_) - 1,
        BLOCK_R=cfg.block_r, BLOCK_D=cfg.block_d, BLOCK_N=cfg.block_n, SPLIT=cfg.split,
        OP_DTYPE=cfg.op_dtype, FP32_DOT=cfg.fp32_dot, RAW_X=False, RAW_C=False, RAW_S=False, F64=False,
        NATIVE=False,
    )
    # a forward launch passes M with strides (D, 1), the backward Mᵀ as (1, D): the unit stride
    # is specialised to the constant 1 either way
    unit = "stride_wk" if cfg.transpose else "stride_wn"
    constexprs[unit] = 1
    # positions: int64 [..., A] and (several axes) an int64 axis; without, a dummy int32 [1]
    pos_ptr = "*i64" if cfg.positions else "*i32"
    ptr_type = {"w_ptr": _PTR[operand_dtype(cfg)], "src_ptr": "*i32",
                "axis_ptr": "*i64" if cfg.positions == 2 else "*i32"}
    for t in "ab":
        ptr_type |= {f"{t}_x": _PTR[cfg.x_dtype], f"{t}_o": _PTR[cfg.x_dtype],
                     f"{t}_c": _PTR[cfg.table_dtype], f"{t}_s": _PTR[cfg.table_dtype], f"{t}_p": pos_ptr}
    # ints of the positions, as rome.RoPE launches BNSD q/k with positions [B, 1, S, A]: row dims
    # (B, N, S) with strides (S*A, 0, A), the axis stride 1 (A > 1) or 0 (one axis, unused), and
    # a power-of-two cache (>= 16 rows). Without positions they are all 0 (divisible).
    pos_ints = ("stride_ax", "stride_pa", "n_pos", "a_sp0", "a_sp1", "a_sp2", "b_sp0", "b_sp1", "b_sp2")
    pos_divisible = ("n_pos", "a_sp1", "b_sp1") + (("stride_pa", "stride_ax") if cfg.positions == 1 else ())
    if cfg.positions == 1:
        constexprs |= {"a_sp2": 1, "b_sp2": 1}
    elif cfg.positions == 2:
        constexprs |= {"stride_pa": 1, "stride_ax": 1}
    signature, divisible = {}, []
    for name in fn.arg_names:
        if name in constexprs:
            continue
        signature[name] = ptr_type.get(name, "i32")
        # pointers are 16-byte aligned; strides of BNSD/BSND tensors with D % 16 == 0 are
        # multiples of 16, as are D itself and the matrix's other stride (and the caches' row
        # strides); row counts are not
        if name in pos_ints:
            if not cfg.positions or name in pos_divisible:
                divisible.append(name)
        elif name in ptr_type or (cfg.head_dim % 16 == 0 and not name.endswith(("rows", "R1", "R2"))):
            divisible.append(name)
    xb, tb = cfg.x_dtype.itemsize, cfg.table_dtype.itemsize
    name = f"{cfg.name} M={matrix_kind}{suffix}"
    meta = dict(x_dtype=_NAME[cfg.x_dtype], head_dim=cfg.head_dim, pass_="bwd" if cfg.transpose else "fwd",
                table_dtype=_NAME[cfg.table_dtype], matrix=matrix_kind,
                block_r=cfg.block_r, block_d=cfg.block_d, block_n=cfg.block_n, split=cfg.split,
                fp32_dot=cfg.fp32_dot, gather_sin=cfg.gather_sin, positions=cfg.positions, angles=cfg.angles,
                tuned_candidate=bool(suffix), product=cfg.product, elements_per_tile=cfg.block_r * cfg.head_dim,
                # one tile: x read and out written, cos and sin read, for block_r rows of head_dim
                bytes_per_tile=cfg.block_r * cfg.head_dim * (2 * xb + 2 * tb), dram_bytes_per_element=2 * xb + 2 * tb)
    return KernelConfig(name, fn, signature, constexprs, tuple(divisible), cfg.num_warps, cfg.num_stages,
                        meta, cfg.options)


_TRITON_TYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                torch.int32: "i32", torch.int64: "i64", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                torch.bool: "i1"}


def specialise(fn, args, consts: dict, cfg: Config, *, name: str | None = None, meta: dict | None = None) -> KernelConfig:
    """The ``KernelConfig`` Triton's JIT compiles for ``fn`` launched with the runtime ``args``
    (positional, in the order of ``fn``'s non-constexpr parameters) and the constexprs ``consts``:
    a tensor is a pointer of its dtype, marked divisible by 16 where its address is 16-byte
    aligned; an int equal to 1 becomes a constant, one divisible by 16 is marked so (0 too), else
    i32 or i64 by its range (a ``do_not_specialize`` int: i32 or i64 only). ``cfg`` gives warps,
    stages and compile options."""
    names = [p.name for p in fn.params if not p.is_constexpr]
    if len(names) != len(args):
        raise ValueError(f"{fn.__name__}: {len(args)} arguments for {len(names)} runtime parameters")
    plain = {p.name for p in fn.params if getattr(p, "do_not_specialize", False)}
    signature, constexprs, divisible = {}, dict(consts), []
    for n, a in zip(names, args):
        if n in plain and isinstance(a, int) and not isinstance(a, bool):  # (do_not_specialize: as it is)
            signature[n] = "i32" if -(1 << 31) <= a < (1 << 31) else "i64"
            continue
        if isinstance(a, torch.Tensor):
            signature[n] = "*" + _TRITON_TYPE[a.dtype]
            if a.data_ptr() % 16 == 0:
                divisible.append(n)
        elif isinstance(a, bool):
            signature[n] = "i1"
        elif isinstance(a, int):
            if a == 1:
                constexprs[n] = 1
                continue
            signature[n] = "i32" if -(1 << 31) <= a < (1 << 31) else "i64"
            if a % 16 == 0:
                divisible.append(n)
        elif isinstance(a, float):
            signature[n] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {n} of type {type(a).__name__}")
    xb, tb = cfg.x_dtype.itemsize, cfg.table_dtype.itemsize
    info = dict(x_dtype=_NAME[cfg.x_dtype], head_dim=cfg.head_dim, pass_="bwd" if cfg.transpose else "fwd",
                table_dtype=_NAME[cfg.table_dtype], product=cfg.product, block_r=cfg.block_r, block_d=cfg.block_d,
                block_n=cfg.block_n, split=cfg.split, fp32_dot=cfg.fp32_dot, gather_sin=cfg.gather_sin,
                positions=cfg.positions, angles=cfg.angles, elements_per_tile=cfg.block_r * cfg.head_dim,
                bytes_per_tile=cfg.block_r * cfg.head_dim * (2 * xb + 2 * tb),
                dram_bytes_per_element=2 * xb + 2 * tb) | (meta or {})
    return KernelConfig(name or cfg.name, fn, signature, constexprs, tuple(divisible), cfg.num_warps,
                        cfg.num_stages, info, cfg.options)
