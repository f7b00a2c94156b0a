"""The fused ROME Triton kernel and its launcher.

    forward     out = x*cos + (x @ M) * sin
    transpose   out = x*cos + (x*sin) @ Mᵀ        (the backward: dx from dy)

x, out: [..., D] with unit last stride, any other strides; cos, sin: broadcast to x (stride 0 on
broadcast dims); M: [D, D]. The row dims of x are collapsed to at most three ``(R0, R1, R2)``,
so a row r sits at ``i0*s0 + i1*s1 + i2*s2``. Each program loads M once (D <= 128; a 256×256 M
would not fit beside the tile, so there it is re-read per tile from cache), then walks row tiles
``[BLOCK_R, BLOCK_D]`` (D padded to a power of two, masked) of x, and of k too when q and k share
the launch: every element of x is read once and written once, the rotation is one ``tl.dot``.
Tile sizes and programs per SM are first guesses, not yet tuned on a GPU.

Precision: elementwise math in fp32, one rounding to x's dtype at the store. The dot takes x in
its own dtype (bf16/fp16 operands on the tensor cores; exact, since with a signed permutation
each output of x @ M is one ±x term in an fp32 accumulator). An fp32 operand that is not exact in
that dtype (x*sin in the transpose) is fed as SPLIT pieces hi + mid + lo whose sum is exactly
that fp32 value (bf16; fp16 pieces below 2**-24 underflow, an absolute error <= 2**-25), so
the product is fp32-exact there too. fp32 x, or a matrix whose dtype differs from half-precision
x, uses fp32 operands with IEEE (not TF32) precision.

Under TRITON_INTERPRET=1 (CPU) bf16 arithmetic and bf16 dots are wrong (triton#11584), and the
fp32 -> bf16 cast truncates instead of rounding to nearest even; there the dot gets fp32
operands holding the same values and the final bf16 rounding is done by hand.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _round_bf16_rne(y):
    # fp32 -> bf16 bits rounded to nearest even (the interpreter's own cast truncates)
    bits = y.to(tl.uint32, bitcast=True)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return tl.where(y != y, y, bits.to(tl.float32, bitcast=True))


@triton.jit
def _dot(v, m, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr,
         OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr):
    # fp32 v [BLOCK_R, BLOCK_D] @ m [BLOCK_D, BLOCK_D], v fed as SPLIT pieces in OP_DTYPE
    acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    rem = v
    for _ in tl.static_range(SPLIT):
        piece = rem.to(OP_DTYPE)
        rem = rem - piece.to(tl.float32)
        if FP32_DOT:
            acc = tl.dot(piece.to(tl.float32), m, acc, input_precision="ieee")
        else:
            acc = tl.dot(piece, m, acc)
    return acc


@triton.jit
def _load_matrix(m_ptr, stride_mk, stride_mn, D, BLOCK_D: tl.constexpr,
                 OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr):
    k = tl.arange(0, BLOCK_D)
    mask = (k[:, None] < D) & (k[None, :] < D)
    m = tl.load(m_ptr + k[:, None] * stride_mk + k[None, :] * stride_mn, mask=mask, other=0.0)
    if FP32_DOT:
        return m.to(tl.float32)
    return m.to(OP_DTYPE)


@triton.jit
def _rotate_rows(pid, nprog, m, m_ptr, stride_mk, stride_mn,
                 x_ptr, o_ptr, c_ptr, s_ptr, n_rows, R1, R2,
                 sx0, sx1, sx2, so0, so1, so2, sc0, sc1, sc2, ss0, ss1, ss2, D,
                 TRANSPOSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                 SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr,
                 HOIST_M: tl.constexpr, RNE_BF16: tl.constexpr):
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    n_tiles = tl.cdiv(n_rows, BLOCK_R)
    for tile in range(pid, n_tiles, nprog):
        r = tl.full((BLOCK_R,), tile, tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # int64 rows
        i2 = r % R2
        i1 = (r // R2) % R1
        i0 = r // R2 // R1
        mask = (r < n_rows)[:, None] & col_ok[None, :]
        x = tl.load(x_ptr + ((i0 * sx0 + i1 * sx1 + i2 * sx2)[:, None] + cols[None, :]),
                    mask=mask, other=0.0).to(tl.float32)
        c = tl.load(c_ptr + ((i0 * sc0 + i1 * sc1 + i2 * sc2)[:, None] + cols[None, :]),
                    mask=mask, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + ((i0 * ss0 + i1 * ss1 + i2 * ss2)[:, None] + cols[None, :]),
                    mask=mask, other=0.0).to(tl.float32)
        if not HOIST_M:
            # D > 128: M does not fit in registers next to the tile; re-read it (L1/L2-resident)
            m = _load_matrix(m_ptr, stride_mk, stride_mn, D, BLOCK_D, OP_DTYPE, FP32_DOT)
        if TRANSPOSE:
            y = x * c + _dot(x * s, m, BLOCK_R, BLOCK_D, SPLIT, OP_DTYPE, FP32_DOT)
        else:
            y = x * c + _dot(x, m, BLOCK_R, BLOCK_D, SPLIT, OP_DTYPE, FP32_DOT) * s
        if RNE_BF16:
            y = _round_bf16_rne(y)
        tl.store(o_ptr + ((i0 * so0 + i1 * so1 + i2 * so2)[:, None] + cols[None, :]),
                 y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rome_kernel(m_ptr, stride_mk, stride_mn,
                 a_x, a_o, a_c, a_s, a_rows, a_R1, a_R2,
                 a_sx0, a_sx1, a_sx2, a_so0, a_so1, a_so2,
                 a_sc0, a_sc1, a_sc2, a_ss0, a_ss1, a_ss2,
                 b_x, b_o, b_c, b_s, b_rows, b_R1, b_R2,
                 b_sx0, b_sx1, b_sx2, b_so0, b_so1, b_so2,
                 b_sc0, b_sc1, b_sc2, b_ss0, b_ss1, b_ss2,
                 D,
                 HAS_B: tl.constexpr, TRANSPOSE: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr,
                 OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr, HOIST_M: tl.constexpr,
                 RNE_BF16: tl.constexpr):
    # Persistent: program p does row tiles p, p + P, ... of a (q), then of b (k), M loaded once.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    m = _load_matrix(m_ptr, stride_mk, stride_mn, D, BLOCK_D, OP_DTYPE, FP32_DOT)
    _rotate_rows(pid, nprog, m, m_ptr, stride_mk, stride_mn,
                 a_x, a_o, a_c, a_s, a_rows, a_R1, a_R2,
                 a_sx0, a_sx1, a_sx2, a_so0, a_so1, a_so2,
                 a_sc0, a_sc1, a_sc2, a_ss0, a_ss1, a_ss2, D,
                 TRANSPOSE, BLOCK_R, BLOCK_D, SPLIT, OP_DTYPE, FP32_DOT, HOIST_M, RNE_BF16)
    if HAS_B:
        _rotate_rows(pid, nprog, m, m_ptr, stride_mk, stride_mn,
                     b_x, b_o, b_c, b_s, b_rows, b_R1, b_R2,
                     b_sx0, b_sx1, b_sx2, b_so0, b_so1, b_so2,
                     b_sc0, b_sc1, b_sc2, b_ss0, b_ss1, b_ss2, D,
                     TRANSPOSE, BLOCK_R, BLOCK_D, SPLIT, OP_DTYPE, FP32_DOT, HOIST_M, RNE_BF16)


INTERPRET = isinstance(_rome_kernel, InterpretedFunction)
MAX_HEAD_DIM = 256
_TL_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
SUPPORTED_DTYPES = tuple(_TL_DTYPE)
_PROGRAMS_PER_SM = 8  # untuned first guess; GPU tuning is its own piece of work
_INTERPRET_PROGRAMS = 3  # few programs, so the tests walk the persistent loop


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def uses_fp32_dot(x_dtype: torch.dtype, matrix_dtype: torch.dtype) -> bool:
    """True where the kernel feeds the dot fp32 operands (IEEE) rather than x's half dtype."""
    return x_dtype == torch.float32 or matrix_dtype != x_dtype


def _row_layout(shape, tensors):
    """Merge the row dims (all but the last) of same-shaped tensors where every stride allows.

    Returns ``[(size, [stride per tensor]), ...]``, outermost first, size-1 dims dropped.
    """
    dims = []
    for i, n in enumerate(shape[:-1]):
        if n == 1:
            continue
        st = [t.stride(i) for t in tensors]
        if dims and all(ps == s * n for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    return dims


def _launch_args(x, out, cos, sin):
    """Kernel args for one tensor, as lists of 3-row-dim blocks (one block unless > 3 dims)."""
    tensors = (x, out, cos, sin)
    dims = _row_layout(x.shape, tensors)
    if len(dims) > 3:  # rare (5D+ with no mergeable dims): one block per index of dim 0
        return [a for i in range(x.shape[0]) for a in _launch_args(*(t[i] for t in tensors))]
    dims = [(1, [0] * 4)] * (3 - len(dims)) + dims
    rows = dims[0][0] * dims[1][0] * dims[2][0]
    strides = [dims[d][1][t] for t in range(4) for d in range(3)]
    return [(x, out, cos, sin, rows, dims[1][0], dims[2][0], *strides)]


def rotate(xs, outs, cos, sin, matrix, *, transpose: bool) -> None:
    """Fill ``outs[i]`` with the (transposed) rotation of ``xs[i]``; one launch for q and k.

    Preconditions (checked by the caller): x and out share shape and dtype, unit last stride;
    cos/sin broadcast to every x and have a unit last stride; matrix is [D, D].
    """
    d = matrix.shape[0]
    x0 = xs[0]
    if not INTERPRET and not x0.is_cuda:
        raise RuntimeError(
            "backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before rome's "
            f"kernel is first used, to run it on the CPU); got tensors on {x0.device}"
        )
    blocks = []
    for x, out in zip(xs, outs):
        if x.numel():
            blocks += _launch_args(x, out, cos.expand(x.shape), sin.expand(x.shape))
    if not blocks:
        return
    block_d = max(16, triton.next_power_of_2(d))
    block_r = 16 if INTERPRET else max(16, min(64, 4096 // block_d))
    fp32_dot = INTERPRET or uses_fp32_dot(x0.dtype, matrix.dtype)
    op_dtype = tl.float32 if uses_fp32_dot(x0.dtype, matrix.dtype) else _TL_DTYPE[x0.dtype]
    # the transpose's dot operand x*sin is an fp32 product: three bf16 pieces hold its 24 bits
    # exactly; fp16 pieces under 2**-24 flush to zero (an absolute error of at most 2**-25)
    split = 3 if transpose and op_dtype != tl.float32 else 1
    sk, sn = matrix.stride()
    if transpose:
        sk, sn = sn, sk
    if INTERPRET:
        max_programs = _INTERPRET_PROGRAMS
    else:
        max_programs = _num_sms(x0.device.index or 0) * _PROGRAMS_PER_SM
    for group in (blocks[i : i + 2] for i in range(0, len(blocks), 2)):
        a, b = group[0], group[-1]
        tiles = max(math.ceil(a[4] / block_r), math.ceil(b[4] / block_r))
        _rome_kernel[(min(tiles, max_programs),)](
            matrix, sk, sn, *a, *b, d,
            HAS_B=len(group) == 2, TRANSPOSE=transpose,
            BLOCK_R=block_r, BLOCK_D=block_d, SPLIT=split,
            OP_DTYPE=op_dtype, FP32_DOT=fp32_dot, HOIST_M=block_d <= 128,
            RNE_BF16=INTERPRET and x0.dtype == torch.bfloat16,
            num_warps=4,
        )
