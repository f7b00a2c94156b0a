"""The fused ROME Triton kernels (source only: ``rome.launch`` chooses a specialisation,
``rome.launcher`` launches it).

    forward     out = x*cos + (x @ M) * sin
    transpose   out = x*cos + (x*sin) @ Mᵀ        (the backward: dx from dy)

Shapes: x, out ``[..., D]`` with unit last stride, any other strides; cos, sin broadcast to x
(stride 0 on broadcast dims); M ``[D, D]``. q and k share one launch.

Two kernels evaluate ``x @ M``:

- ``_rome_gather_kernel``, for a signed permutation (every rotation matrix, partial rotary's
  too): ``(x @ M)[:, j] == sign[j] * x[:, src[j]]`` exactly, so the product is a second load of
  the same rows at the columns ``src`` (L1 hits) and a sign folded into sin. Its tile is
  ``BLOCK_R`` rows along which the tables vary (T rows) × all D columns; a program reads its
  tables once and walks a group of heads (the rows that share those tables) of q and then of k,
  ``DEPTH`` heads a batch (``rome.launch.gather_depth``), the next batch's loads issued before
  this batch's arithmetic. Where a group is not every head (``SEAM``, a decode step: one program
  an SM, its time a chain of round trips), q's groups and k's are apart, the first batch's x and
  partners are issued before the tables (caches at positions after them) are waited on, and the
  last batch is peeled so that nothing is prefetched past the group.
  How the partner ``x[:, src]`` is read follows the permutation's pair class (``PAIRS_*``:
  interleave's pairs swapped in registers, kept pairs one load per run of ``KEPT_RUN`` columns
  (a whole head's half rotation: 16 bytes), else one per element). The whole head's half
  rotation itself (llama's, NeoX's rotate_half: src[j] = (j + D/2) % D), 16-bit x on sm_90 with
  tables or a cache at one position per row and no norm, takes ``HALVES`` (``_halves_heads``,
  ``rome.launch.halves_config``): each head held as its two halves, whose partner is the other
  half, so no partner load and no second copy of the head in registers: twice the rows a tile.
  A src that pairs every column with another in runs of 2 or more (each section's half rotation,
  default's 44/44/40; also at positions on several axes) is held the same way, A and B the pairs'
  columns read from a table in src's place (``HALVES_RUN``, ``rome.launch.halves_pairs``): the
  partner form's rows, more heads a batch; launched only inside ``rome.launch.pairs_halves()``
  (measured 1-5 points slower than the partner form on an H200).
  Memory-bound: x read and out written once, the tables read about once per launch.
  The q/k norm over all of a token's heads (``NORM_RMS_HEADS``) takes the same kernel's token
  tile instead of the head groups (``_token_heads``, ``HEADS_B`` > 0): a token's heads held in
  registers as blocks, persistent programs per tensor, so the token's statistics need x once.
  With ``DOT`` the same kernel evaluates ``x @ M`` as the seed's matmul formulation instead: a
  tensor-core dot of each head's tile with M, read once per program (``[D, D]``, D <= 128: 32 KB
  in bf16, in shared memory for the whole program), for a rotation matrix where
  ``rome.launch.product("dot")`` asks, so the report measures the dot beside the gather with
  everything else equal. Exact: each output of ``x @ M`` is one ±x term (fp32 x as three bf16
  pieces); the backward's ``(dy*sin) @ Mᵀ`` is ``(dy @ Mᵀ) * sin[src]``, the row's sin moved to
  src in registers (read there, its addresses and values each crossed into the mma layout in the
  one-program-an-SM prologue). Its cost over the gather: M's slice read from shared memory by each
  warp's mma once per 16 rows (~8 B per element at 32-row tiles), and the accumulator's layout;
  on sm_90 (16-bit x, D <= 128) 64-row tiles on 16 warps, bf16 two heads a batch (``DEPTH``,
  ``rome.launch.dot_wide``): half M's traffic an element, and the next head's loads in flight.
- ``_rome_kernel``, the seed's matmul formulation as a persistent row-tile kernel, for a general
  matrix, and for a rotation matrix with D > 128 under ``product("dot")``. Rows
  of x are collapsed to at most three dims ``(R0, R1, R2)``; a program walks row tiles
  ``[BLOCK_R, BLOCK_D]`` (D padded to a power of two, masked), persistent over the tiles of q and
  then of k as one sequence (a tile of k picks k's pointers and strides by scalar selects). The
  product is cut into ``BLOCK_N``-wide column panels: output panel n is ``Σ_k x[:, panel k] @
  M[panel k, panel n]`` over the blocks of M that are nonzero (``NZ``, a bitmask found once per
  matrix on the host). The output panels are unrolled, the sum over k is a runtime loop that
  skips zero blocks: one dot per panel in the code whatever D. An M block is 64×64 (8 KB in
  bf16) and is re-read per tile from L1/L2; registers and shared memory stay small for every D
  up to 256 (``python -m profiling kernels`` shows the numbers).

On a GPU the tile rows and warps of the gather kernel are autotuned (``rome.tuning``, once per
specialisation and device, among ``rome.launch.candidates``); every other launch, and every
launch under the interpreter, takes ``rome.launch.choose``'s sizes.

Exactness of the product. The gather is exact by construction. In the dot kernel half-precision
x is a tensor-core operand as it is: with a signed
permutation each output of x @ M is one ±x term in the fp32 accumulator, so exact. fp32 x with
a matrix exact in bf16 (every rotation matrix) is fed as SPLIT=3 bf16 pieces hi + mid + lo whose
sum is x exactly: three tensor-core dots, still exact. A general matrix with fp32 x uses IEEE
fp32 dots (correct, not exact). The backward of a signed permutation needs no split:
``((dy*sin) @ Mᵀ)[j] == (dy @ Mᵀ)[j] * sin[src[j]]`` with src[j] the row of Mᵀ's nonzero in column j,
so it is the forward's one dot on dy plus a gathered sin (``GATHER_SIN``). A general matrix's
backward feeds the fp32 product dy*sin as three bf16 pieces (bf16 x), or as IEEE fp32 (fp16
and fp32 x: fp16 pieces would overflow where |dy*sin| > 65504).

Exactness of the sum: ``x*cos + r*sin`` is computed with error-free products (fma) and a
TwoSum, so the cancellation of the two terms costs nothing: the fp32 result is within 1 ulp
of the exact value (faithful except where the terms cancel past 2**-20 of their size), and one
more rounding to bf16/fp16 keeps it within 1 ulp of that dtype. bf16 in and out (the gather
kernel without a norm) takes a shorter exact sum, ``_dot2_short``: x and its partner have 8
significant bits, so one error-free product, one fma and one add (6 instructions where the
TwoSum takes 14) land within 1/64 ulp of the exact value before the final rounding: within 1
bf16 ulp (tests/test_gather_kernel.py, terms cancelling to 2**-30 of their size). The launch
disables the compiler's mul+add fusion so the TwoSum is computed as written. Where ``x*cos + r*sin`` rounds
to ±inf (it overflows, or a term is infinite) the result is that infinity, not the NaN the
error terms (inf - inf) would give. cos and sin may differ in dtype: each is read as its own.

``NATIVE`` (``rounding="native"``; both kernels, a signed permutation only) replaces that
epilogue by the eager chain's rounding (``_native``): cos and sin rounded to x's dtype, ``x*cos``
and ``r*sin`` each rounded to it, their float32 sum rounded by the store; fp fusion off, so no fma.

Positions (``POSITIONS`` > 0, in both kernels with the table path, chosen by constexpr): cos/sin
are then caches ``[P, D]`` (row strides ``stride_pc``/``stride_ps``) and a positions tensor, int32
or int64 ``[..., A]`` broadcast to x's rows (stride 0 over heads), gives each element its cache
row: ``pos[r]`` for one axis (read once per row tile), ``pos[r, axis[j]]`` for several (axis: int
``[D]``, read through its stride; the transpose's gathered sin at ``src[j]`` reads
``pos[r, axis[src[j]]]`` at column ``src[j]``; the gather's forward on 2-4 axes, ``AXES``, reads a
row's A positions once each and picks a column's by its axis in registers). Offsets and packed sequences (``cu_seqlens``) are folded into the positions
on the host (``rome.positions``: A ints per token, against 2·D floats for a per-token table), so
the kernel has one indexing rule. A position outside ``[0, P)`` is never read: the load is masked
and the element becomes NaN (the op raises on the host before launching; the mask is what
protects a launch that skipped that check, e.g. under CUDA graph capture).

Angles (``ANGLES``, with positions): no cache; c holds inv_freq as fp32 ``hi`` and ``lo`` rows
(``[2, D]``) and s the per-column scale, also hi + lo. ``_cos_sin_angle`` forms the angle
``p*hi + p*lo`` as a double-float (the product's error from fma), takes the quadrant from a
compensated product with 2/π, reduces by π/2 in double-float (π/2 in three fp32 pieces, the
products exact, the sums TwoSums), and evaluates Taylor polynomials on [-π/4, π/4] whose large
terms (r, r³/6, 1 - r²/2, r⁴/24, and the scale's product) are formed error-free and summed with
one final rounding, the reduced angle's low part as a first-order correction: max
|cos - cos64| 3.05e-8 for positions up to 2**20, against the fp32 table's own rounding, 2.98e-8
(fp32 angles: 6e-2). Only IEEE fp32 adds and multiplies (fp fusion is off) and exact products,
so the interpreter's results are a GPU's.

Under TRITON_INTERPRET=1 (CPU) bf16 arithmetic and bf16 dots are wrong (triton#11584), the
interpreter converts bf16 subnormals wrongly and casts fp32 -> bf16 by truncation; there bf16 is
loaded and stored as raw bits (exact), the dot gets fp32 operands holding the same values, the
final rounding to bf16 is done by hand, and the error-free product uses float64 (triton 3.2's
interpreter fma rounds twice). CPU tests therefore see the bits a GPU produces.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction



# --- element helpers ----------------------------------------------------------------------


@triton.jit
def _load(ptr, offsets, mask, RAW_BF16: tl.constexpr):
    # any float dtype -> fp32; RAW_BF16: bf16 read as its 16 bits and widened exactly
    if RAW_BF16:
        bits = tl.load(ptr.to(tl.pointer_type(tl.int16)) + offsets, mask=mask, other=0)
        return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _bf16_bits(y):
    # fp32 -> the 16 bits of bf16, rounded to nearest even by hand (subnormals and overflow to
    # inf included, as the GPU's cvt.rn.bf16.f32); NaN keeps its payload
    bits = y.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(y != y, bits >> 16, rounded)


@triton.jit
def _store(ptr, offsets, y, mask, RAW_BF16: tl.constexpr):
    # fp32 -> out dtype; RAW_BF16: rounded to bf16 by hand and written as 16 bits
    if RAW_BF16:
        tl.store(ptr.to(tl.pointer_type(tl.int16)) + offsets, _bf16_bits(y).to(tl.int16), mask=mask)
    else:
        tl.store(ptr + offsets, y.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _two_prod(a, b, F64: tl.constexpr):
    # a*b == p + e exactly (fp32); F64: the error from a float64 product (exact for fp32 a, b)
    p = a * b
    if F64:
        e = (a.to(tl.float64) * b.to(tl.float64) - p.to(tl.float64)).to(tl.float32)
    else:  # (-p as p * -1.0: triton 3.6 lowers unary minus to 0 - p, an FADD a fma cannot fold;
        # LLVM turns the product into fneg, a free operand modifier of the FFMA)
        e = tl.fma(a, b, p * -1.0)
    return p, e


@triton.jit
def _two_sum(p, q):
    # p + q == t + err exactly (TwoSum)
    t = p + q
    z = t - p
    return t, (p - (t - z)) + (q - z)


@triton.jit
def _sum2(p, q, small):
    # p + q + small, with p + q exact by TwoSum and the small terms added last. Where p + q
    # rounds to +-inf (the result overflows, or a term is infinite) the error terms are inf - inf
    # = NaN: the result is then that infinity (NaN stays NaN)
    t, err = _two_sum(p, q)
    return tl.where(tl.abs(t) == float("inf"), t, t + (err + small))


@triton.jit
def _dot2(x, c, r, s, F64: tl.constexpr):
    # x*c + r*s: error-free products, then their parts summed (near-correctly rounded)
    p, ep = _two_prod(x, c, F64)
    q, eq = _two_prod(r, s, F64)
    return _sum2(p, q, ep + eq)


@triton.jit
def _dot2_short(x, c, r, s, F64: tl.constexpr):
    # x*c + r*s for x and r of bf16's 8 significant bits, the result rounded to bf16 by the store:
    # r*s == q + eq exactly (an error-free product), y = fma(x, c, q) rounds once, y + eq the
    # second rounding. 6 instructions where _dot2 takes 14, and within 1 ulp of bf16: x*c and r*s
    # have at most 32 significant bits, so a nonzero sum is >= 2**-34 of |q| and the fma's error,
    # <= 2**-24 |y| <= 2**-24 |v| + 2**-48 |q|, is <= 2**-14 of the result: 1/64 of a bf16 ulp.
    # (Not for fp16's 11 bits: there the bound is 2**-11, a fp16 ulp.) Also for the normalised
    # x̂ = x·rstd·w of the token tile's forward, any dtype: its error against q + x̂·c is
    # <= 2**-24 |y| + 2**-48 |q|, and x̂ (as the partner) already carries up to 2**-23 |x̂| from its two
    # roundings: where the sum cancels below 2**-24 |q|, x̂·c is about q and that error, ~2**-23
    # |q|, is 2**25 times the fma's extra term; elsewhere the term is under 2**-24 |y|. _dot2's
    # 8 instructions more an element bought nothing there (the token tile's forward was
    # issue-bound on them: Wan 2.1 88.2 -> 95.1% of copy by the model). y infinite: the result
    q = r * s
    if F64:  # an interpreter whose fma rounds twice: the error and the fma through float64
        # (x*c exact there; the sum rounds in float64 before float32 only where the terms are
        # 2**21 apart, and then differs from one rounding only on a float32 tie)
        eq = (r.to(tl.float64) * s.to(tl.float64) - q.to(tl.float64)).to(tl.float32)
        y = (x.to(tl.float64) * c.to(tl.float64) + q.to(tl.float64)).to(tl.float32)
    else:
        eq = tl.fma(r, s, q * -1.0)
        y = tl.fma(x, c, q)
    return tl.where(tl.abs(y) == float("inf"), y, y + eq)


@triton.jit
def _add2(x, c, a, F64: tl.constexpr):
    # x*c + a for an exact fp32 term a
    p, ep = _two_prod(x, c, F64)
    return _sum2(p, a, ep)


@triton.jit
def _in_dtype(v, ty: tl.constexpr, RAW_BF16: tl.constexpr):
    # fp32 v rounded to nearest even in x's dtype ty and widened back (exact; fp32: v itself);
    # RAW_BF16: bf16 rounded by hand (the interpreter's cast truncates)
    if RAW_BF16:
        return (_bf16_bits(v) << 16).to(tl.float32, bitcast=True)
    return v.to(ty).to(tl.float32)


@triton.jit
def _native(x, c, r, s, ty: tl.constexpr, RAW_BF16: tl.constexpr):
    # rounding="native": x*c + r*s as the eager chain computes it in x's dtype ty: the tables
    # rounded to ty, each product computed in fp32 and rounded to ty, their fp32 sum left to the
    # store's rounding. No fma: the launch turns fp fusion off (fp32: plain fp32 ops)
    c = _in_dtype(c, ty, RAW_BF16)
    s = _in_dtype(s, ty, RAW_BF16)
    return _in_dtype(x * c, ty, RAW_BF16) + _in_dtype(r * s, ty, RAW_BF16)


@triton.jit
def _dot(v, w, acc, SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr):
    # acc += v @ w, fp32 v fed as SPLIT bf16 pieces whose sum is v, cut by integer ops on the bits
    # (no conversion unit, so no scoreboard a load must share): each piece the top 16 bits of what
    # is left (a truncation: exact, the rest exact in fp32; 8 + 8 + 8 bits of the significand),
    # the last one rounded to nearest (exact above bf16's smallest subnormal, 2**-133; below it
    # what is left past it is <= 2**-134; it is <= 2**-16 of v, so the rounding cannot carry to inf)
    # (one return: Triton generates the code after a constexpr branch's return too)
    if SPLIT == 1:  # v is exact in OP_DTYPE (or the dot is fp32): no rounding to do
        if FP32_DOT:
            acc = tl.dot(v, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(v.to(OP_DTYPE), w, acc)
    else:
        rem = v
        for i in tl.static_range(SPLIT):
            bits = rem.to(tl.int32, bitcast=True)
            if i == SPLIT - 1:
                bits = bits + 0x8000  # half of the last kept bit: round half away from zero
            bits = bits & -65536
            piece = bits.to(tl.float32, bitcast=True)
            rem = rem - piece
            if FP32_DOT:
                acc = tl.dot(piece, w, acc, input_precision="ieee")
            else:
                acc = tl.dot((bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True), w, acc)
    return acc


# --- tables: per-row, or gathered from a cache by position ---------------------------------


@triton.jit
def _cache_rows(p_ptr, prow, axis_ptr, stride_ax, stride_pa, n_pos, tcols, mask, D):
    # several axes: the cache row of element (r, j) is pos[r, axis[j]]; and whether it is in range
    a = tl.load(axis_ptr + tcols * stride_ax, mask=tcols < D, other=0).to(tl.int64)
    p = tl.load(p_ptr + prow[:, None] + a[None, :] * stride_pa, mask=mask, other=0).to(tl.int64)
    return p, (p >= 0) & (p < n_pos)


@triton.jit
def _table(t_ptr, offsets, mask, ok, RAW_T: tl.constexpr, POSITIONS: tl.constexpr):
    # cos or sin at offsets; with positions, a position outside the cache is never read: NaN
    if POSITIONS == 0:
        return _load(t_ptr, offsets, mask, RAW_T)
    v = _load(t_ptr, offsets, mask & ok, RAW_T)
    return tl.where(ok, v, float("nan"))


@triton.jit
def _sin_at(s_ptr, sr, p_ptr, prow, axis_ptr, stride_ax, stride_pa, stride_ps, n_pos, p_ok, tcols, mask, D,
            RAW_S: tl.constexpr, POSITIONS: tl.constexpr,
            ANGLES: tl.constexpr, c_ptr, stride_pc, prow_p, F64: tl.constexpr):
    # sin at rows r and columns tcols (the transpose reads it at other columns than x's)
    if ANGLES:  # computed at the columns' own positions (prow_p: the row's position, one axis)
        if POSITIONS == 2:
            p, ok = _cache_rows(p_ptr, prow, axis_ptr, stride_ax, stride_pa, n_pos, tcols, mask, D)
        else:
            p, ok = prow_p, p_ok
        _, s = _angle_tables(c_ptr, stride_pc, s_ptr, stride_ps, p, ok, tcols, D, F64)
        return s
    if POSITIONS == 2:
        spos, ok = _cache_rows(p_ptr, prow, axis_ptr, stride_ax, stride_pa, n_pos, tcols, mask, D)
        return _table(s_ptr, sr[:, None] + spos * stride_ps + tcols[None, :], mask, ok, RAW_S, POSITIONS)
    return _table(s_ptr, sr[:, None] + tcols[None, :], mask, p_ok, RAW_S, POSITIONS)


# --- angles computed from positions (ANGLES): cos/sin of p * inv_freq, ~0.51 fp32 ulp -----------

_PIO2_1 = tl.constexpr(1.5707963705062866)  # pi/2 = _PIO2_1 + _PIO2_2 + _PIO2_3 (fp32 pieces)
_PIO2_2 = tl.constexpr(-4.371138828673793e-08)  # exact in fp32
_PIO2_3 = tl.constexpr(-1.7151244994428829e-15)
_SIN3_HI = tl.constexpr(-0.1666666716337204)  # -1/6 = _SIN3_HI + _SIN3_LO
_SIN3_LO = tl.constexpr(4.967053879312289e-09)
_COS4_HI = tl.constexpr(0.0416666679084301)  # 1/24 = _COS4_HI + _COS4_LO
_COS4_LO = tl.constexpr(-1.2417634698280722e-09)
_2_PI_HI = tl.constexpr(0.6366197466850281)  # 2/pi = _2_PI_HI + _2_PI_LO (+ 2.9e-16)
_2_PI_LO = tl.constexpr(2.5682552973194106e-08)


@triton.jit
def _scaled(a, b, small, sh, sl, F64: tl.constexpr):
    # (sh + sl) * (a + b + small) rounded once (up to the small terms' own error): a + b exact
    # by TwoSum, its high part times sh exact by _two_prod
    t, err = _two_sum(a, b)
    hp, he = _two_prod(t, sh, F64)
    return hp + (he + ((err + small) * sh + t * sl))


@triton.jit
def _cos_sin_angle(p, hi, lo, sh, sl, F64: tl.constexpr):
    # sc*cos, sc*sin of p*(hi + lo): p an integer-valued fp32 (< 2**24), inv_freq = hi + lo and
    # the column's output scale sc = sh + sl (1, or YaRN's attention factor) fp32 pairs; each
    # result rounded once
    ah, ae = _two_prod(p, hi, F64)  # p*hi exactly; the angle is ah + ae + w + we
    w, we = _two_prod(p, lo, F64)
    # quadrant k = round(angle * 2/pi) from a compensated product: an fp32 product alone is off
    # by one quadrant for large angles (its rounding past 2**17, and the angle's low part) and
    # leaves |r| > pi/4, where the polynomials below lose accuracy (0.9 ulp at 2**20 before this)
    zero = tl.zeros_like(ah)
    yh, ye = _two_prod(ah, zero + _2_PI_HI, F64)
    k = tl.floor(yh + 0.5)
    f = (yh - k) + ((ye + ah * _2_PI_LO) + (ae + w) * _2_PI_HI)  # yh - k exact: angle*2/pi - k
    k = k + tl.where(f > 0.5, 1.0, 0.0) - tl.where(f < -0.5, 1.0, 0.0)
    p1, e1 = _two_prod(k, zero + _PIO2_1, F64)
    p2, e2 = _two_prod(k, zero + _PIO2_2, F64)
    d = ah - p1  # exact (Sterbenz: ah is within pi/4 of k*pi/2)
    # the angle - k*pi/2 = d + ae - e1 + w - p2 + (we - e2 - k*_PIO2_3): the middle terms reach
    # ~0.06 at position 2**20, so they are summed exactly too (plain fp32 sums cost 0.13 ulp)
    u, ue = _two_sum(ae, -e1)
    u, ue2 = _two_sum(u, w)
    v, ve = _two_sum(u, -p2)
    r, re = _two_sum(d, v)  # r + rl = the reduced angle, |r| <= pi/4, |rl| <= ulp(r)
    rl = re + (((ue + ue2) + (ve + we)) - (e2 + k * _PIO2_3))
    # sin r = r - r^3/6 + r^5 S(r^2), cos r = 1 - r^2/2 + r^4/24 + r^6 C(r^2) (Taylor, truncation
    # < 1e-11 on [-pi/4, pi/4]). The large terms are formed error-free (products split by
    # _two_prod, 1/6 and 1/24 as fp32 pairs) and summed with one final rounding; the tails
    # (< 2.5e-3) carry only fp32 relative error: ~0.5 ulp + 1e-9 in all
    r2, r2e = _two_prod(r, r, F64)  # r^2 = r2 + r2e
    r3, r3e = _two_prod(r, r2, F64)  # r^3 = r3 + r3e + r*r2e
    r4, r4e = _two_prod(r2, r2, F64)  # r^4 = r4 + r4e + 2*r2*r2e
    m3, m3e = _two_prod(r3, zero + _SIN3_HI, F64)
    m4, m4e = _two_prod(r4, zero + _COS4_HI, F64)
    s5 = r3 * r2 * (1.0 / 120 + r2 * (-1.0 / 5040 + r2 * (1.0 / 362880 + r2 * (-1.0 / 39916800))))
    c6 = r4 * r2 * (-1.0 / 720 + r2 * (1.0 / 40320 + r2 * (-1.0 / 3628800 + r2 * (1.0 / 479001600))))
    h = 0.5 * r2
    # sin(r + rl) = sin r + rl cos r;  cos(r + rl) = cos r - rl sin r
    s_small = (m3e + ((r3e + r * r2e) * _SIN3_HI + r3 * _SIN3_LO)) + s5 + rl * ((1.0 - h) + m4)
    s = _scaled(r, m3, s_small, sh, sl, F64)
    t = 1.0 - h  # 1 - r^2/2 = t + err exactly (Fast2Sum)
    err = (1.0 - t) - h
    c_small = ((err - 0.5 * r2e) + (m4e + ((r4e + 2.0 * r2 * r2e) * _COS4_HI + r4 * _COS4_LO))) + c6 - rl * (r + m3)
    c = _scaled(t, m4, c_small, sh, sl, F64)
    q = k.to(tl.int32) & 3
    cos = tl.where(q == 0, c, tl.where(q == 1, -s, tl.where(q == 2, -c, s)))
    sin = tl.where(q == 0, s, tl.where(q == 1, c, tl.where(q == 2, -s, -c)))
    return cos, sin


@triton.jit
def _angle_tables(f_ptr, stride_f, scale_ptr, stride_sc, p, ok, tcols, D, F64: tl.constexpr):
    # cos and sin at columns tcols for positions p ([R, 1] or [R, N]): inv_freq = f[0] + f[1],
    # times the column's scale sc[0] + sc[1]; pass-through columns (inv_freq 0) are exactly 1 and 0
    cmask = tcols < D
    hi = tl.load(f_ptr + tcols, mask=cmask, other=0.0)[None, :]
    lo = tl.load(f_ptr + stride_f + tcols, mask=cmask, other=0.0)[None, :]
    sh = tl.load(scale_ptr + tcols, mask=cmask, other=0.0)[None, :]
    sl = tl.load(scale_ptr + stride_sc + tcols, mask=cmask, other=0.0)[None, :]
    c, s = _cos_sin_angle(p.to(tl.float32), hi, lo, sh, sl, F64)
    rotated = (hi != 0.0) | (lo != 0.0)
    c = tl.where(rotated, c, 1.0)
    s = tl.where(rotated, s, 0.0)
    return tl.where(ok, c, float("nan")), tl.where(ok, s, float("nan"))


# --- one row tile ---------------------------------------------------------------------------


@triton.jit
def _rotate_tile(tile, w_ptr, stride_wk, stride_wn, src_ptr,
                 axis_ptr, stride_ax, stride_pa, stride_pc, stride_ps, n_pos,
                 x_ptr, o_ptr, c_ptr, s_ptr, p_ptr, n_rows, R1, R2,
                 sx0, sx1, sx2, so0, so1, so2, sc0, sc1, sc2, ss0, ss1, ss2, sp0, sp1, sp2, D,
                 POSITIONS: tl.constexpr, ANGLES: tl.constexpr,
                 TRANSPOSE: tl.constexpr, GATHER_SIN: tl.constexpr, NZ: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                 SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr,
                 RAW_X: tl.constexpr, RAW_C: tl.constexpr, RAW_S: tl.constexpr, F64: tl.constexpr,
                 NATIVE: tl.constexpr):
    # rows [tile*BLOCK_R, +BLOCK_R) of one tensor, output panel by output panel (static: the
    # panels' loads are independent); panel n sums its nonzero blocks k in a runtime loop, so
    # the code holds one dot per panel whatever D (an unrolled NP x NP took minutes to compile)
    NP: tl.constexpr = BLOCK_D // BLOCK_N  # column panels
    pcols = tl.arange(0, BLOCK_N)
    r = tl.full((BLOCK_R,), tile, tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # int64 rows
    i2 = r % R2
    i1 = (r // R2) % R1
    i0 = r // R2 // R1
    row_ok = (r < n_rows)[:, None]
    xr = (i0 * sx0 + i1 * sx1 + i2 * sx2)[:, None]
    orow = (i0 * so0 + i1 * so1 + i2 * so2)[:, None]
    cr = i0 * sc0 + i1 * sc1 + i2 * sc2  # [BLOCK_R] (0 with positions: a cache row per token)
    sr = i0 * ss0 + i1 * ss1 + i2 * ss2
    prow = i0 * sp0 + i1 * sp1 + i2 * sp2  # the row's positions (POSITIONS > 0)
    p1 = r  # (one axis: the row's position, [BLOCK_R, 1])
    if POSITIONS == 1:  # one axis: the row's cache row, once per tile
        p = tl.load(p_ptr + prow, mask=r < n_rows, other=0).to(tl.int64)
        if not ANGLES:
            cr += p * stride_pc
            sr += p * stride_ps
        p_ok = ((p >= 0) & (p < n_pos))[:, None]
        p1 = p[:, None]
    else:
        p_ok = row_ok
    for n in tl.static_range(NP):
        cols = n * BLOCK_N + pcols
        mask = row_ok & (cols < D)[None, :]
        x = _load(x_ptr, xr + cols[None, :], mask, RAW_X)
        if ANGLES:  # cos and sin computed from the positions and frequencies
            if POSITIONS == 2:
                cpos, ok = _cache_rows(p_ptr, prow, axis_ptr, stride_ax, stride_pa, n_pos, cols, mask, D)
            else:
                cpos, ok = p1, p_ok
            c, s = _angle_tables(c_ptr, stride_pc, s_ptr, stride_ps, cpos, ok, cols, D, F64)
        elif POSITIONS == 2:  # cos and sin at cols share the positions read
            cpos, ok = _cache_rows(p_ptr, prow, axis_ptr, stride_ax, stride_pa, n_pos, cols, mask, D)
            c = _table(c_ptr, cr[:, None] + cpos * stride_pc + cols[None, :], mask, ok, RAW_C, POSITIONS)
            s = _table(s_ptr, sr[:, None] + cpos * stride_ps + cols[None, :], mask, ok, RAW_S, POSITIONS)
        else:
            c = _table(c_ptr, cr[:, None] + cols[None, :], mask, p_ok, RAW_C, POSITIONS)
            s = _table(s_ptr, sr[:, None] + cols[None, :], mask, p_ok, RAW_S, POSITIONS)
        acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
        blocks = (NZ >> (n * NP)) & ((1 << NP) - 1)  # bit k: block (k, n) of W is nonzero
        for k in range(NP):
            if (blocks >> k) & 1:
                kcols = k * BLOCK_N + pcols
                kmask = row_ok & (kcols < D)[None, :]
                if k == n:  # x's own panel, already loaded (times sin, already read)
                    v = x
                    if TRANSPOSE and not GATHER_SIN:
                        v = x * s
                else:
                    v = _load(x_ptr, xr + kcols[None, :], kmask, RAW_X)
                    if TRANSPOSE and not GATHER_SIN:
                        v = v * _sin_at(s_ptr, sr, p_ptr, prow, axis_ptr, stride_ax, stride_pa, stride_ps,
                                        n_pos, p_ok, kcols, kmask, D, RAW_S, POSITIONS,
                                        ANGLES, c_ptr, stride_pc, p1, F64)
                wmask = (kcols < D)[:, None] & (cols < D)[None, :]
                w = tl.load(w_ptr + kcols[:, None] * stride_wk + cols[None, :] * stride_wn,
                            mask=wmask, other=0.0)
                w = w.to(tl.float32) if FP32_DOT else w.to(OP_DTYPE)
                acc = _dot(v, w, acc, SPLIT, OP_DTYPE, FP32_DOT)
        if TRANSPOSE and not GATHER_SIN:
            y = _add2(x, c, acc, F64)  # acc already holds (x*sin) @ Wᵀ
        else:
            if GATHER_SIN:
                src = tl.load(src_ptr + cols, mask=cols < D, other=0)
                s = _sin_at(s_ptr, sr, p_ptr, prow, axis_ptr, stride_ax, stride_pa, stride_ps,
                            n_pos, p_ok, src, mask, D, RAW_S, POSITIONS,
                            ANGLES, c_ptr, stride_pc, p1, F64)
            if NATIVE:  # (a signed permutation: acc is x @ W exactly)
                y = _native(x, c, acc, s, o_ptr.dtype.element_ty, RAW_X)
            else:
                y = _dot2(x, c, acc, s, F64)
        _store(o_ptr, orow + cols[None, :], y, mask, RAW_X)


@triton.jit
def _rome_kernel(
    # the dot's matrix W ([D, D]: M forward, Mᵀ backward, by strides) and, with GATHER_SIN, src:
    # int32 [D], the row of W's nonzero in each column (where sin is read in the transpose)
    w_ptr, stride_wk, stride_wn, src_ptr,
    # with POSITIONS: axis (int [D], the position axis of each column, read through its stride;
    # POSITIONS == 2), the positions' axis stride, the row strides of the cos and sin caches and
    # their row count
    axis_ptr, stride_ax, stride_pa, stride_pc, stride_ps, n_pos,
    # tensor a (q): x, out, cos, sin, positions; rows = R0*R1*R2 with strides per row dim for each
    a_x, a_o, a_c, a_s, a_p, a_rows, a_R1, a_R2,
    a_sx0, a_sx1, a_sx2, a_so0, a_so1, a_so2,
    a_sc0, a_sc1, a_sc2, a_ss0, a_ss1, a_ss2, a_sp0, a_sp1, a_sp2,
    # tensor b (k), the same (b_rows = 0 when there is no k)
    b_x, b_o, b_c, b_s, b_p, b_rows, b_R1, b_R2,
    b_sx0, b_sx1, b_sx2, b_so0, b_so1, b_so2,
    b_sc0, b_sc1, b_sc2, b_ss0, b_ss1, b_ss2, b_sp0, b_sp1, b_sp2,
    D,  # head_dim
    POSITIONS: tl.constexpr,  # 0: per-row tables; 1: cache row pos[r]; 2: pos[r, axis[j]]
    ANGLES: tl.constexpr,  # with positions: cos/sin computed from them (c: inv_freq hi/lo rows, s: scale)
    TRANSPOSE: tl.constexpr,  # backward: x*cos + (x*sin) @ Mᵀ
    GATHER_SIN: tl.constexpr,  # W is a signed permutation: (x*sin) @ W == (x @ W) * sin[src]
    NZ: tl.constexpr,  # bitmask of W's nonzero [BLOCK_N, BLOCK_N] blocks, bit n*NP + k for block (k, n)
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,  # tile rows, padded D, panel
    SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr,  # the dot's operand: SPLIT pieces in OP_DTYPE
    FP32_DOT: tl.constexpr,  # fp32 operands, IEEE (general matrices; the interpreter)
    RAW_X: tl.constexpr, RAW_C: tl.constexpr, RAW_S: tl.constexpr,  # interpreter: x / cos / sin in bf16, read as raw bits
    F64: tl.constexpr,  # interpreter: error-free products through float64
    NATIVE: tl.constexpr = False,  # rounding="native" (a signed permutation only): _native
):
    # Persistent over the row tiles of a (q) and then of b (k), as one sequence: program p does
    # tiles p, p + P, ...; a tile of b takes b's arguments by scalar selects, so the tile's code
    # is compiled once for both tensors.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    a_tiles = tl.cdiv(a_rows, BLOCK_R)
    for t in range(pid, a_tiles + tl.cdiv(b_rows, BLOCK_R), nprog):
        on_b = t >= a_tiles
        _rotate_tile(tl.where(on_b, t - a_tiles, t), w_ptr, stride_wk, stride_wn, src_ptr,
                     axis_ptr, stride_ax, stride_pa, stride_pc, stride_ps, n_pos,
                     tl.where(on_b, b_x, a_x), tl.where(on_b, b_o, a_o), tl.where(on_b, b_c, a_c),
                     tl.where(on_b, b_s, a_s), tl.where(on_b, b_p, a_p), tl.where(on_b, b_rows, a_rows),
                     tl.where(on_b, b_R1, a_R1), tl.where(on_b, b_R2, a_R2),
                     tl.where(on_b, b_sx0, a_sx0), tl.where(on_b, b_sx1, a_sx1), tl.where(on_b, b_sx2, a_sx2),
                     tl.where(on_b, b_so0, a_so0), tl.where(on_b, b_so1, a_so1), tl.where(on_b, b_so2, a_so2),
                     tl.where(on_b, b_sc0, a_sc0), tl.where(on_b, b_sc1, a_sc1), tl.where(on_b, b_sc2, a_sc2),
                     tl.where(on_b, b_ss0, a_ss0), tl.where(on_b, b_ss1, a_ss1), tl.where(on_b, b_ss2, a_ss2),
                     tl.where(on_b, b_sp0, a_sp0), tl.where(on_b, b_sp1, a_sp1), tl.where(on_b, b_sp2, a_sp2),
                     D, POSITIONS, ANGLES, TRANSPOSE, GATHER_SIN, NZ, BLOCK_R, BLOCK_D, BLOCK_N,
                     SPLIT, OP_DTYPE, FP32_DOT, RAW_X, RAW_C, RAW_S, F64, NATIVE)




# --- the gather kernel: x @ M as the signed column gather it is ------------------------------


@triton.jit
def _fetch(ptr, offsets, mask, RAW_BF16: tl.constexpr):
    # a load kept in its own dtype until used (half the registers of fp32 for a prefetched tile);
    # RAW_BF16: bf16 read as its 16 bits (the interpreter)
    if RAW_BF16:
        return tl.load(ptr.to(tl.pointer_type(tl.int16)) + offsets, mask=mask, other=0)
    return tl.load(ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _widen(v, RAW_BF16: tl.constexpr):
    # a _fetch'ed value -> fp32, exactly
    if RAW_BF16:
        return (v.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)



# src[D] of the gather kernel's index (``rome.launch.gather_index``): how the permutation moves
# column pairs (2i, 2i + 1), which decides how the partner x[:, src] is read
PAIRS_NONE = tl.constexpr(0)  # any permutation: one 2- or 4-byte load per element (L1 hits)
PAIRS_KEPT = tl.constexpr(1)  # src[2i] even, src[2i+1] = src[2i] + 1: one load per pair (per KEPT_RUN)
PAIRS_SWAPPED = tl.constexpr(2)  # src[j] = j ^ 1 (interleave): the partner is in x's own registers

# the gather kernel's QK-norm prologue (forward only): none, RMSNorm, LayerNorm over each head's D
NORM_NONE = tl.constexpr(0)
NORM_RMS = tl.constexpr(1)
NORM_LAYER = tl.constexpr(2)
NORM_RMS_HEADS = tl.constexpr(3)  # RMSNorm over all heads of a token (the program holds them all)
SWEEP = tl.constexpr(4)  # heads the norm-over-heads forward's first sweep loads at once (_rotate_heads,
# written out there), and its backward's (_heads_norm_grad: dy, partner and xn a head):
SWEEP_GRAD = tl.constexpr(2)


@triton.jit
def _pair_swap(v, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # v[:, j ^ 1]: the two columns of each pair exchanged. A thread holds whole pairs of a row (x's
    # layout puts >= 2 consecutive columns in a thread), so this renames registers: no instruction
    a, b = tl.split(tl.reshape(v, [BLOCK_R, BLOCK_D // 2, 2]))
    return tl.reshape(tl.join(b, a), [BLOCK_R, BLOCK_D])


@triton.jit
def _while(mask, h, h_hi):
    # mask where head h exists (h < h_hi), as a tensor (the interpreter's masks must be)
    return mask & (tl.full(mask.shape, h, tl.int32) < h_hi)


@triton.jit
def _within(mask, h, h_lo, h_hi):
    # mask where head h is one of [h_lo, h_hi) (a sweep walking down: h below h_lo)
    hs = tl.full(mask.shape, h, tl.int32)
    return mask & (hs >= h_lo) & (hs < h_hi)


@triton.jit
def _prev_head(ha, hb, H1):
    # head (ha, hb) -> the one before it, h = ha * H1 + hb (no division)
    hb -= 1
    wrap = hb < 0
    return tl.where(wrap, ha - 1, ha), tl.where(wrap, H1 - 1, hb)


@triton.jit
def _next_head(ha, hb, H1):
    # head (ha, hb) -> the next one, h = ha * H1 + hb (no division)
    hb += 1
    wrap = hb == H1
    return tl.where(wrap, ha + 1, ha), tl.where(wrap, 0, hb)


@triton.jit
def _normed(v, mean, rstd, nw, nb, NORM: tl.constexpr):
    # the norm's affine step in fp32: (v - mean) * rstd * weight (+ bias for LayerNorm); rstd and
    # mean [BLOCK_R, 1] per row, nw/nb the weight and bias at v's columns
    if NORM == NORM_LAYER:
        return (v - mean) * rstd * nw + nb
    return v * rstd * nw


@triton.jit
def _rstd(var, eps, ROUNDED: tl.constexpr = False):
    # 1/sqrt(var + eps) in fp32 by the hardware's reciprocal square root (MUFU.RSQ: relative error
    # < 2^-22.9, about one fp32 ulp, as torch's rsqrt on CUDA; the correctly rounded square root
    # then division rounds twice too). That pair (sqrt_rn, div_rn) cost ~20 instructions a row and
    # a slow-path call: per head, where each head's rows take one, it nearly doubled the norm's
    # instructions per byte (0.32 against 0.18 warp-instructions per DRAM byte, sm_90, bf16
    # D=128) and held the fused launch below copy in the static model. ROUNDED: the pair, for
    # LayerNorm (its bias rows leave the fewest registers: with the cheaper root ptxas schedules
    # its forward into 8 B of stack on sm_100, triton 3.9, and its fp16 backward into 16-24 B on
    # sm_80, triton 3.6; with the pair as before)
    if ROUNDED:
        return tl.math.div_rn(1.0 + tl.zeros_like(var), tl.sqrt_rn(var + eps))
    return tl.math.rsqrt(var + eps)


@triton.jit
def _row_stats(xw, m, eps, D, NORM: tl.constexpr):
    # mean (LayerNorm; 0 for RMSNorm) and 1/sqrt(var + eps) (_rstd) over a head's D columns, per
    # row, in fp32 (padded columns and masked rows are 0 in xw)
    if NORM == NORM_LAYER:
        mean = tl.sum(xw, axis=1)[:, None] / D
        xc = tl.where(m, xw - mean, 0.0)
        var = tl.sum(xc * xc, axis=1)[:, None] / D
    else:
        mean = tl.zeros([xw.shape[0], 1], dtype=tl.float32)
        var = tl.sum(xw * xw, axis=1)[:, None] / D
    return mean, _rstd(var, eps, NORM == NORM_LAYER)


@triton.jit
def _norm_grad(g, xn, m, nw, eps, D, NORM: tl.constexpr):
    # the norm's backward per head row, in fp32, from g = the gradient of the normalised value
    # (the transposed rotation of dy, exact in fp32) and xn = the forward's input at the same
    # element: x̂ = (xn - mean) * rstd, gw = g * w,
    #   dx = rstd * (gw - x̂ * mean(gw * x̂) [- mean(gw)  LayerNorm])
    # and the head's terms of dw = Σ_rows g * x̂ and db = Σ_rows g as tiles (masked elements:
    # g = 0, x̂ = 0), summed over heads in registers and over rows once per program
    mean, rstd = _row_stats(xn, m, eps, D, NORM)
    xhat = tl.where(m, (xn - mean) * rstd, 0.0)
    gw = g * nw
    inner = gw - xhat * (tl.sum(gw * xhat, axis=1)[:, None] / D)
    if NORM == NORM_LAYER:
        inner = inner - tl.sum(gw, axis=1)[:, None] / D
    return rstd * inner, g * xhat, g


@triton.jit
def _rotated(xw, c, r, s, x, o_ptr, SHORT: tl.constexpr, RAW_X: tl.constexpr, F64: tl.constexpr):
    # xw*c + r*s exactly summed (xw: x as loaded, widened): _dot2_short where SHORT allows it and x
    # and out are bf16 (x and its partner of 8 significant bits), else _dot2
    if SHORT and o_ptr.dtype.element_ty == tl.bfloat16 and (RAW_X or x.dtype == tl.bfloat16):
        return _dot2_short(xw, c, r, s, F64)
    return _dot2(xw, c, r, s, F64)


@triton.jit
def _head(o_ptr, x, g, ho, o_off, m, c, s, w, nw, nws, nb, nbs, eps, D, rstd_heads, xn,
          PAIR: tl.constexpr, DOT: tl.constexpr, SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr,
          FP32_DOT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, RAW_X: tl.constexpr,
          F64: tl.constexpr, NORM: tl.constexpr, NATIVE: tl.constexpr, NORM_GRAD: tl.constexpr):
    # one head's math and store (m: the store's mask) from its x tile and partner g = x[:, src],
    # loaded earlier. The product x @ M: g (PAIRS_SWAPPED: x's own pairs swapped in registers, g
    # unused), or with DOT the dot x @ w (the program's matrix). NORM: x normalised first, over
    # the head's D values of each row (all in the tile): the partner is the same row, so it
    # shares the row's mean and rstd and takes the weight (bias) at src (nws, nbs); the
    # normalised values stay fp32 into the rotation, rounded once at the store. NORM_RMS_HEADS:
    # the rows' 1/rms over all the token's heads is rstd_heads, and nw/nws this head's weights.
    # NORM_GRAD (the transpose: x is dy): the norm's backward as the epilogue (xn: the forward's
    # input at this head's tile, loaded with x), see _norm_grad; returns this head's terms of dw
    # and db ([BLOCK_R, BLOCK_D] fp32; zeros without NORM_GRAD)
    xw = _widen(x, RAW_X)
    if NORM == NORM_RMS_HEADS:
        mean = rstd_heads * 0.0
        rstd = rstd_heads
        xw = _normed(xw, mean, rstd, nw, nb, NORM)
    elif NORM != NORM_NONE:
        mean, rstd = _row_stats(xw, m, eps, D, NORM)
        xw = _normed(xw, mean, rstd, nw, nb, NORM)
    if DOT:
        if SPLIT > 1 or FP32_DOT:  # fp32 x as pieces; fp32 operands (the interpreter)
            v = xw
        else:  # x as loaded is the operand (bf16/fp16 on a GPU)
            v = x
        r = _dot(v, w, tl.zeros(xw.shape, dtype=tl.float32), SPLIT, OP_DTYPE, FP32_DOT)
    elif PAIR == PAIRS_SWAPPED:
        r = _pair_swap(xw, BLOCK_R, BLOCK_D)
    else:
        r = _widen(g, RAW_X)
        if NORM != NORM_NONE:
            r = _normed(r, mean, rstd, nws, nbs, NORM)
    dw = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    db = dw
    if NATIVE:
        y = _native(xw, c, r, s, o_ptr.dtype.element_ty, RAW_X)
    else:  # (the normalised values could take _dot2_short too: there it spilled 40-56 B at the
        # per-head prologue's 128 registers, triton 3.6, sm_90)
        y = _rotated(xw, c, r, s, x, o_ptr, NORM == NORM_NONE and NORM_GRAD == NORM_NONE, RAW_X, F64)
    if NORM_GRAD != NORM_NONE:
        y, dw, db = _norm_grad(y, _widen(xn, RAW_X), m, nw, eps, D, NORM_GRAD)
    _store(o_ptr + ho, o_off, y, m, RAW_X)
    return dw, db


@triton.jit
def _swap(on, a, b):
    # (b, a) where the scalar ``on`` holds, else (a, b)
    return tl.where(on, b, a), tl.where(on, a, b)


@triton.jit
def _partner(x_ptr, g_off, m, x, PAIR: tl.constexpr, DOT: tl.constexpr, RAW_X: tl.constexpr):
    # the partner's load x[:, src] of a head (its lines are x's: L1 hits), issued with x's; none
    # where the partner is in x's registers (PAIRS_SWAPPED) or the dot makes the product
    if DOT or PAIR == PAIRS_SWAPPED:
        return x
    return _fetch(x_ptr, g_off, m, RAW_X)


@triton.jit
def _head_weights(nw_ptr, h, cols, src, cm, D, PAIR: tl.constexpr):
    # head h's norm weights ([H*D] head-major, fp32) at the columns and at src, as [1, BLOCK_D]
    # rows (L1/L2 hits: 2 * 4 * D bytes a head against its tile's BLOCK_R * D * 2 * x bytes)
    nw = tl.load(nw_ptr + h * D + cols, mask=cm, other=0.0)[None, :]
    nws = nw
    if PAIR != PAIRS_SWAPPED:
        nws = tl.load(nw_ptr + h * D + src, mask=cm, other=0.0)[None, :]
    return nw, nws


@triton.jit
def _batch(o_ptr, x0, g0, xn0, x1, g1, xn1, x2, g2, xn2, x3, g3, h, h_lo, h_hi, hac, hbc, H1, soh0, soh1, o_off, mask,
           c, s, w, nw, nws, nb, nbs, eps, D, rstd, nw_ptr, cols, src, cm, dwa, dba,
           PAIR: tl.constexpr, DOT: tl.constexpr, SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr,
           FP32_DOT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, RAW_X: tl.constexpr,
           F64: tl.constexpr, NORM: tl.constexpr, NATIVE: tl.constexpr, NORM_GRAD: tl.constexpr, K: tl.constexpr):
    # one batch of _rotate_heads: heads h .. h + K - 1 (those below h_hi stored; (hac, hbc) the
    # first one's head indices, returned past the batch) from their loaded x (x0..x3), partners
    # (g0..g3) and the forward's input (xn0, xn1: NORM_GRAD); dwa, dba: the norm backward's sums
    # (NORM_RMS_HEADS: each head's own weights, [H*D] head-major, h local to the tensor)
    dwa, dba, hac, hbc = _batch_head(o_ptr, x0, g0, xn0, h, h_lo, h_hi, hac, hbc, H1, soh0, soh1, o_off, mask, c, s,
                                     w, nw, nws, nb, nbs, eps, D, rstd, nw_ptr, cols, src, cm, dwa, dba, PAIR, DOT,
                                     SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, F64, NORM, NATIVE, NORM_GRAD,
                                     False)
    if K >= 2:
        dwa, dba, hac, hbc = _batch_head(o_ptr, x1, g1, xn1, h + 1, h_lo, h_hi, hac, hbc, H1, soh0, soh1, o_off, mask,
                                         c, s, w, nw, nws, nb, nbs, eps, D, rstd, nw_ptr, cols, src, cm, dwa, dba, PAIR,
                                         DOT, SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, F64, NORM, NATIVE,
                                         NORM_GRAD, True)
    if K >= 3:
        dwa, dba, hac, hbc = _batch_head(o_ptr, x2, g2, xn2, h + 2, h_lo, h_hi, hac, hbc, H1, soh0, soh1, o_off, mask,
                                         c, s, w, nw, nws, nb, nbs, eps, D, rstd, nw_ptr, cols, src, cm, dwa, dba, PAIR,
                                         DOT, SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, F64, NORM, NATIVE,
                                         NORM_GRAD, True)
    if K >= 4:
        dwa, dba, hac, hbc = _batch_head(o_ptr, x3, g3, xn2, h + 3, h_lo, h_hi, hac, hbc, H1, soh0, soh1, o_off, mask,
                                         c, s, w, nw, nws, nb, nbs, eps, D, rstd, nw_ptr, cols, src, cm, dwa, dba, PAIR,
                                         DOT, SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, F64, NORM, NATIVE,
                                         NORM_GRAD, True)
    hac, hbc = _next_head(hac, hbc, H1)
    return dwa, dba, hac, hbc


@triton.jit
def _batch_head(o_ptr, x, g, xn, h, h_lo, h_hi, hac, hbc, H1, soh0, soh1, o_off, mask, c, s, w, nw, nws, nb, nbs, eps,
                D, rstd, nw_ptr, cols, src, cm, dwa, dba, PAIR: tl.constexpr, DOT: tl.constexpr, SPLIT: tl.constexpr,
                OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                RAW_X: tl.constexpr, F64: tl.constexpr, NORM: tl.constexpr, NATIVE: tl.constexpr,
                NORM_GRAD: tl.constexpr, NEXT: tl.constexpr):
    # one head of a _batch: head h (local h - h_lo: its own weights under NORM_RMS_HEADS) at head
    # indices (hac, hbc), or with NEXT the one after them (stored where h < h_hi; the batch's first
    # head always is); its norm-backward sums added to dwa, dba; returns them and its indices
    hl = h - h_lo
    if NEXT:
        hac, hbc = _next_head(hac, hbc, H1)
        mask = _while(mask, h, h_hi)
    o_head = hac * soh0 + hbc * soh1
    if NORM == NORM_RMS_HEADS:
        nw, nws = _head_weights(nw_ptr, hl, cols, src, cm, D, PAIR)
    dw, db = _head(o_ptr, x, g, o_head, o_off, mask, c, s, w, nw, nws, nb, nbs, eps, D, rstd, xn, PAIR, DOT, SPLIT,
                   OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, F64, NORM, NATIVE, NORM_GRAD)
    dwa += dw
    if NORM_GRAD == NORM_LAYER:
        dba += db
    return dwa, dba, hac, hbc


@triton.jit
def _next_load(x_ptr, x_off, g_off, sxh0, sxh1, H1, ha, hb, h, h_hi, mask, x, LOAD: tl.constexpr,
               PAIR: tl.constexpr, DOT: tl.constexpr, RAW_X: tl.constexpr):
    # the head after (ha, hb), local index h: its indices, offset, x (LOAD: issued here, else the
    # caller's x) and partner, none past h_hi
    ha, hb = _next_head(ha, hb, H1)
    hx = ha * sxh0 + hb * sxh1
    if LOAD:
        x = _fetch(x_ptr + hx, x_off, _while(mask, h, h_hi), RAW_X)
    return ha, hb, hx, x, _partner(x_ptr + hx, g_off, _while(mask, h, h_hi), x, PAIR, DOT, RAW_X)


@triton.jit
def _first_batch(x_ptr, xn_ptr, x_off, g_off, sxh0, sxh1, H1, h_lo, h_hi, mask, x0, x1, x2, x3, LOADED: tl.constexpr,
                 PAIR: tl.constexpr, DOT: tl.constexpr, RAW_X: tl.constexpr, K: tl.constexpr, DEPTH: tl.constexpr,
                 XN: tl.constexpr):
    # the loads of _rotate_heads' first batch: heads h_lo .. h_lo + K - 1 (those below h_hi), x
    # (LOADED 1: x0 issued by the caller; 3: x0 .. x3, DEPTH heads), the partner, and with XN the
    # forward's input xn; returns (ha, hb) of the last head loaded and the batch's tiles
    ha = h_lo // H1  # (once per program: a division)
    hb = h_lo % H1
    hx0 = ha * sxh0 + hb * sxh1
    if LOADED == 0:
        x0 = _fetch(x_ptr + hx0, x_off, _while(mask, h_lo, h_hi), RAW_X)
    g0 = _partner(x_ptr + hx0, g_off, _while(mask, h_lo, h_hi), x0, PAIR, DOT, RAW_X)
    xn0 = x0
    if XN:
        xn0 = _fetch(xn_ptr + hx0, x_off, _while(mask, h_lo, h_hi), RAW_X)
    g1 = g0
    g2 = g0
    g3 = g0
    xn1 = xn0
    LOAD: tl.constexpr = LOADED < 3 or K != DEPTH  # (else the caller issued x1 .. x3)
    if K >= 2:
        ha, hb, hx1, x1, g1 = _next_load(x_ptr, x_off, g_off, sxh0, sxh1, H1, ha, hb, h_lo + 1, h_hi, mask, x1,
                                         LOAD, PAIR, DOT, RAW_X)
        if XN:
            xn1 = _fetch(xn_ptr + hx1, x_off, _while(mask, h_lo + 1, h_hi), RAW_X)
    else:
        x1 = x0
    if K >= 3:
        ha, hb, _, x2, g2 = _next_load(x_ptr, x_off, g_off, sxh0, sxh1, H1, ha, hb, h_lo + 2, h_hi, mask, x2, LOAD,
                                       PAIR, DOT, RAW_X)
    else:
        x2 = x0
    if K >= 4:
        ha, hb, _, x3, g3 = _next_load(x_ptr, x_off, g_off, sxh0, sxh1, H1, ha, hb, h_lo + 3, h_hi, mask, x3, LOAD,
                                       PAIR, DOT, RAW_X)
    else:
        x3 = x0
    return ha, hb, x0, x1, x2, x3, g0, g1, g2, g3, xn0, xn1


@triton.jit
def _rotate_heads(x_ptr, o_ptr, x_off, g_off, o_off, sxh0, sxh1, soh0, soh1, H1, h_lo, h_hi,
                  mask, c, s, w, x0, pre, nw_ptr, nb_ptr, src_ptr, eps, D, xn_ptr, dw_ptr,
                  LOADED: tl.constexpr, PAIR: tl.constexpr, DOT: tl.constexpr, SPLIT: tl.constexpr,
                  OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                  RAW_X: tl.constexpr, F64: tl.constexpr, NORM: tl.constexpr, NATIVE: tl.constexpr,
                  NORM_GRAD: tl.constexpr, DEPTH: tl.constexpr, APART: tl.constexpr):
    # heads [h_lo, h_hi) of one tensor (h = ha * H1 + hb) at the program's T rows, K at a time:
    # x of the first K heads (LOADED 1: x0, the first one's, already issued by the caller; 3:
    # x0 .. x3, the first batch's x, ``pre``: (x1, x2, x3); APART: the whole first batch's loads,
    # ``pre``: _first_batch's), then per
    # iteration x of the next K heads issued before the K heads' math and stores, and taken over
    # at the iteration's end: K heads' bytes in flight through the whole iteration. (A ring of K
    # heads one head apart does not keep them: ptxas places each load about one head's work
    # before its use, or its register moves wait on it; a load used only after the loop's back
    # edge stays in flight for the iteration.) Heads past h_hi in the last batch: no loads, no store
    # (head offsets: int64 where the strides are, I64 launches; else int32: every offset of x fits)
    # (any permutation's: 8 more registers a head)
    # NORM_GRAD (the transpose with the norm's backward, x = dy): the forward's input xn read at
    # each stored head (same strides as dy), the tensor's dw (and db) partial sums over the
    # program's heads and rows stored at the end to row program_id of dw_ptr ([programs, 2, D])
    # (the norm's backward on fp32 x: one head a batch, where two spill 16-56 B at the register cap)
    # APART (a program's few heads: rome.launch.head_groups): the last batch after the loop,
    # which then never prefetches past h_hi (a decode step's one batch: no loop trip at all)
    K: tl.constexpr = 1 if PAIR == PAIRS_NONE and not DOT else DEPTH  # (DEPTH: rome.launch.gather_depth)
    # NORM: this tensor's norm weight (and LayerNorm's bias), fp32 [D], at the columns and at src,
    # read once for all its heads (weight + offset formed on the host)
    nw = s
    nws = s
    nb = s
    nbs = s
    rstd = tl.zeros([BLOCK_R, 1], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_D)
    cm = cols < D
    src = cols
    if NORM != NORM_NONE:
        src = tl.load(src_ptr + cols, mask=cm, other=0)
    dwa = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)  # NORM_GRAD: Σ over heads of g·x̂ (and g)
    dba = dwa
    if NORM_GRAD != NORM_NONE:  # (the weight at the columns: dx's rows are x's own)
        nw = tl.load(nw_ptr + cols, mask=cm, other=0.0)[None, :]
    if NORM == NORM_RMS_HEADS:
        nw = tl.zeros([1, BLOCK_D], dtype=tl.float32)  # (set per head in the loop)
        nws = nw
        # first sweep: the sum of squares over the token's heads [h_lo, h_hi) (the launch gives a
        # program all of them), SWEEP heads' loads issued together (one head an iteration waited
        # on each head's round trip: 2 KB a program in flight, the static model's 40% of copy for
        # Wan 2.1's forward at 800 ns); the second sweep below re-reads each head (L2 hits at
        # best: at the worst end DRAM again). (Walking this sweep down with three heads in flight,
        # as the backward's first sweep walks, took 841 us against 679 for one head an iteration
        # on an H100 for Wan 2.1's q/k.)
        acc = tl.zeros([BLOCK_R, 1], dtype=tl.float32)
        sa = h_lo // H1
        sb = h_lo % H1
        for hh in range(h_lo, h_hi, SWEEP):
            v0 = _fetch(x_ptr + (sa * sxh0 + sb * sxh1), x_off, _while(mask, hh, h_hi), RAW_X)
            sa, sb = _next_head(sa, sb, H1)
            v1 = _fetch(x_ptr + (sa * sxh0 + sb * sxh1), x_off, _while(mask, hh + 1, h_hi), RAW_X)
            sa, sb = _next_head(sa, sb, H1)
            v2 = _fetch(x_ptr + (sa * sxh0 + sb * sxh1), x_off, _while(mask, hh + 2, h_hi), RAW_X)
            sa, sb = _next_head(sa, sb, H1)
            v3 = _fetch(x_ptr + (sa * sxh0 + sb * sxh1), x_off, _while(mask, hh + 3, h_hi), RAW_X)
            sa, sb = _next_head(sa, sb, H1)
            w0 = _widen(v0, RAW_X)
            w1 = _widen(v1, RAW_X)
            w2 = _widen(v2, RAW_X)
            w3 = _widen(v3, RAW_X)
            acc += tl.sum(w0 * w0 + w1 * w1 + w2 * w2 + w3 * w3, axis=1)[:, None]
        var = acc / (tl.maximum(h_hi - h_lo, 1) * D).to(tl.float32)  # (no heads here: unused)
        rstd = _rstd(var, eps)
    elif NORM != NORM_NONE:  # (as [1, BLOCK_D] rows: a thread holds only its columns' values)
        nw = tl.load(nw_ptr + cols, mask=cm, other=0.0)[None, :]
        nws = nw
        if PAIR != PAIRS_SWAPPED:
            nws = tl.load(nw_ptr + src, mask=cm, other=0.0)[None, :]
        nb = nw
        nbs = nws
        if NORM == NORM_LAYER:
            nb = tl.load(nb_ptr + cols, mask=cm, other=0.0)[None, :]
            nbs = nb
            if PAIR != PAIRS_SWAPPED:
                nbs = tl.load(nb_ptr + src, mask=cm, other=0.0)[None, :]
    XN: tl.constexpr = NORM_GRAD == NORM_RMS or NORM_GRAD == NORM_LAYER  # xn read with x, as deep
    hac = h_lo // H1  # the head stored next (its offset formed at the store: fewer registers held)
    hbc = h_lo % H1
    if APART:  # (the first batch's loads issued by the caller: ha, hb its last head)
        ha, hb, x0, x1, x2, x3, g0, g1, g2, g3, xn0, xn1 = pre
    else:
        x1 = x0
        x2 = x0
        x3 = x0
        if LOADED == 3:
            x1, x2, x3 = pre
        ha, hb, x0, x1, x2, x3, g0, g1, g2, g3, xn0, xn1 = _first_batch(x_ptr, xn_ptr, x_off, g_off, sxh0, sxh1, H1,
                                                                        h_lo, h_hi, mask, x0, x1, x2, x3, LOADED,
                                                                        PAIR, DOT, RAW_X, K, DEPTH, XN)
    xn2 = xn0
    for h in range(h_lo, h_hi - K if APART else h_hi, K):
        # the next batch's loads
        ha, hb = _next_head(ha, hb, H1)
        nx0 = ha * sxh0 + hb * sxh1
        n0 = _fetch(x_ptr + nx0, x_off, _while(mask, h + K, h_hi), RAW_X)
        m0 = _partner(x_ptr + nx0, g_off, _while(mask, h + K, h_hi), n0, PAIR, DOT, RAW_X)
        p0 = n0
        if XN:
            p0 = _fetch(xn_ptr + nx0, x_off, _while(mask, h + K, h_hi), RAW_X)
        n1 = n0
        m1 = m0
        n2 = n0
        m2 = m0
        n3 = n0
        m3 = m0
        p1 = p0
        p2 = p0
        if K >= 2:
            ha, hb, nx1, n1, m1 = _next_load(x_ptr, x_off, g_off, sxh0, sxh1, H1, ha, hb, h + K + 1, h_hi, mask, n1,
                                             True, PAIR, DOT, RAW_X)
            if XN:
                p1 = _fetch(xn_ptr + nx1, x_off, _while(mask, h + K + 1, h_hi), RAW_X)
        if K >= 3:
            ha, hb, _, n2, m2 = _next_load(x_ptr, x_off, g_off, sxh0, sxh1, H1, ha, hb, h + K + 2, h_hi, mask, n2,
                                           True, PAIR, DOT, RAW_X)
        if K >= 4:
            ha, hb, _, n3, m3 = _next_load(x_ptr, x_off, g_off, sxh0, sxh1, H1, ha, hb, h + K + 3, h_hi, mask, n3,
                                           True, PAIR, DOT, RAW_X)
        # this batch
        dwa, dba, hac, hbc = _batch(o_ptr, x0, g0, xn0, x1, g1, xn1, x2, g2, xn2, x3, g3, h, h_lo, h_hi, hac, hbc, H1,
                                    soh0, soh1, o_off, mask, c, s, w, nw, nws, nb, nbs, eps, D, rstd, nw_ptr, cols,
                                    src, cm, dwa, dba, PAIR, DOT, SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D,
                                    RAW_X, F64, NORM, NATIVE, NORM_GRAD, K)
        x0 = n0
        x1 = n1
        x2 = n2
        x3 = n3
        g3 = m3
        g0 = m0
        g1 = m1
        g2 = m2
        xn0 = p0
        xn1 = p1
        xn2 = p2
    if APART:  # the last batch, loaded by the last trip (or the prologue)
        h = h_lo + K * tl.maximum(tl.cdiv(h_hi - h_lo, K) - 1, 0)
        dwa, dba, hac, hbc = _batch(o_ptr, x0, g0, xn0, x1, g1, xn1, x2, g2, xn2, x3, g3, h, h_lo, h_hi, hac, hbc, H1,
                                    soh0, soh1, o_off, mask, c, s, w, nw, nws, nb, nbs, eps, D, rstd, nw_ptr, cols,
                                    src, cm, dwa, dba, PAIR, DOT, SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D,
                                    RAW_X, F64, NORM, NATIVE, NORM_GRAD, K)
    if NORM_GRAD != NORM_NONE:
        row = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * 2 * D
        tl.store(dw_ptr + row + cols, tl.sum(dwa, axis=0), mask=cm)
        tl.store(dw_ptr + row + D + cols, tl.sum(dba, axis=0), mask=cm)


@triton.jit
def _transposed(xv, pv, c, s, PAIR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                RAW_X: tl.constexpr, F64: tl.constexpr):
    # one head's rotation in fp32 from its loaded x (here dy) and partner x[:, src]: x*c + x[:, src]*s
    # (s: sin at src, signed; PAIRS_SWAPPED: the partner is x's own pairs swapped)
    xw = _widen(xv, RAW_X)
    if PAIR == PAIRS_SWAPPED:
        r = _pair_swap(xw, BLOCK_R, BLOCK_D)
    else:
        r = _widen(pv, RAW_X)
    return _dot2(xw, c, r, s, F64)


@triton.jit
def _head_loads(x_ptr, xn_ptr, hx, x_off, g_off, m, PAIR: tl.constexpr, RAW_X: tl.constexpr):
    # a head's dy tile, its partner dy[:, src] and the forward's x tile (hx: the head's offset)
    xv = _fetch(x_ptr + hx, x_off, m, RAW_X)
    return xv, _partner(x_ptr + hx, g_off, m, xv, PAIR, False, RAW_X), _fetch(xn_ptr + hx, x_off, m, RAW_X)


@triton.jit
def _sweep_terms(xv, pv, nv, hh, h_lo, nw_ptr, cols, cm, c, s, ssq, sgx, D, PAIR: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, RAW_X: tl.constexpr, F64: tl.constexpr):
    # head hh's terms of the first sweep of _heads_norm_grad, from its loaded dy, partner and xn
    # (none below h_lo: its loads were masked, its weight is not read)
    g = _transposed(xv, pv, c, s, PAIR, BLOCK_R, BLOCK_D, RAW_X, F64)
    xn = _widen(nv, RAW_X)
    w = tl.load(nw_ptr + (hh - h_lo) * D + cols, mask=cm & (tl.full(cm.shape, hh, tl.int32) >= h_lo),
                other=0.0)[None, :]
    return ssq + tl.sum(xn * xn, axis=1)[:, None], sgx + tl.sum(g * w * xn, axis=1)[:, None]


@triton.jit
def _heads_norm_grad(x_ptr, o_ptr, xn_ptr, dw_ptr, x_off, g_off, o_off, sxh0, sxh1, soh0, soh1, H1, h_lo, h_hi,
                     mask, c, s, nw_ptr, eps, D, PAIR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                     RAW_X: tl.constexpr, F64: tl.constexpr):
    # the backward of RMSNorm over a token's H heads (the program holds them all: [h_lo, h_hi)) as
    # the transposed rotation's epilogue, in two sweeps over the heads, N = H*D per row:
    #   1. per row Σ xn² and Σ g·w·xn, g = the transposed rotation of dy, xn the forward's input;
    #   2. g again (dy's lines: L1/L2 hits), dx = rstd·g·w − xn·rstd³·Σ g·w·xn / N (rstd from 1.),
    #      and each head's share of dw = Σ_rows g·xn·rstd, stored at row program_id of dw_ptr
    #      ([programs, 2, H*D]; the second half, db's, unused).
    # The first sweep issues SWEEP_GRAD heads' dy, partner and xn together, the second the next
    # head's before this head's math (one head in flight behind the one in use; the first sweep
    # that way held 2 KB a program in flight: the static model's 40% of copy for Wan 2.1's
    # backward at 800 ns). The first sweep walks the heads down, the second up: the
    # heads read last are re-read first (L1, then L2 hits; in the same order each re-read would
    # come a whole token set later). DRAM: dy and xn read once, dx written once (3 passes' bytes).
    cols = tl.arange(0, BLOCK_D)
    cm = cols < D
    ssq = tl.zeros([BLOCK_R, 1], dtype=tl.float32)
    sgx = tl.zeros([BLOCK_R, 1], dtype=tl.float32)
    hl = h_hi - 1
    ha = hl // H1
    hb = hl % H1
    for i in range(h_lo, h_hi, SWEEP_GRAD):
        hh = hl - (i - h_lo)  # heads hh, hh - 1 this iteration: their loads issued together
        xa, pa, na = _head_loads(x_ptr, xn_ptr, ha * sxh0 + hb * sxh1, x_off, g_off,
                                 _within(mask, hh, h_lo, h_hi), PAIR, RAW_X)
        ha, hb = _prev_head(ha, hb, H1)
        xb, pb, nb = _head_loads(x_ptr, xn_ptr, ha * sxh0 + hb * sxh1, x_off, g_off,
                                 _within(mask, hh - 1, h_lo, h_hi), PAIR, RAW_X)
        ha, hb = _prev_head(ha, hb, H1)
        ssq, sgx = _sweep_terms(xa, pa, na, hh, h_lo, nw_ptr, cols, cm, c, s, ssq, sgx, D, PAIR, BLOCK_R, BLOCK_D,
                                RAW_X, F64)
        ssq, sgx = _sweep_terms(xb, pb, nb, hh - 1, h_lo, nw_ptr, cols, cm, c, s, ssq, sgx, D, PAIR, BLOCK_R,
                                BLOCK_D, RAW_X, F64)
    n = (tl.maximum(h_hi - h_lo, 1) * D).to(tl.float32)
    rstd = _rstd(ssq / n, eps)
    k3 = rstd * rstd * rstd * sgx / n
    row = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * 2 * (h_hi - h_lo) * D
    ha = h_lo // H1
    hb = h_lo % H1
    xv, pv, nv = _head_loads(x_ptr, xn_ptr, ha * sxh0 + hb * sxh1, x_off, g_off, _while(mask, h_lo, h_hi),
                             PAIR, RAW_X)
    for hh in range(h_lo, h_hi):
        ho = ha * soh0 + hb * soh1
        ha, hb = _next_head(ha, hb, H1)
        xv2, pv2, nv2 = _head_loads(x_ptr, xn_ptr, ha * sxh0 + hb * sxh1, x_off, g_off, _while(mask, hh + 1, h_hi),
                                    PAIR, RAW_X)
        g = _transposed(xv, pv, c, s, PAIR, BLOCK_R, BLOCK_D, RAW_X, F64)
        xn = _widen(nv, RAW_X)
        w = tl.load(nw_ptr + (hh - h_lo) * D + cols, mask=cm, other=0.0)[None, :]
        _store(o_ptr + ho, o_off, rstd * (g * w) - xn * k3, mask, RAW_X)
        tl.store(dw_ptr + row + (hh - h_lo) * D + cols, tl.sum(g * xn * rstd, axis=0), mask=cm)
        xv = xv2
        pv = pv2
        nv = nv2


@triton.jit
def _row_positions(p_ptr, prow, stride_pa, row_ok, AXES: tl.constexpr):
    # a row's positions on AXES (2-4) axes: [BLOCK_R] each, one load an axis a
    # thread (_by_axis picks a column's)
    p0 = tl.load(p_ptr + prow, mask=row_ok, other=0)
    p1 = p0
    p2 = p0
    p3 = p0
    if AXES >= 2:
        p1 = tl.load(p_ptr + prow + stride_pa, mask=row_ok, other=0)
    if AXES >= 3:
        p2 = tl.load(p_ptr + prow + 2 * stride_pa, mask=row_ok, other=0)
    if AXES >= 4:
        p3 = tl.load(p_ptr + prow + 3 * stride_pa, mask=row_ok, other=0)
    return p0, p1, p2, p3


@triton.jit
def _by_axis(rows, ax, AXES: tl.constexpr):
    # pos[r, ax[j]] ([BLOCK_R, BLOCK_D]) from _row_positions' rows: a column's position picked by
    # its axis ax ([BLOCK_R, BLOCK_D]) in registers. (Read per element, ptxas issued each
    # position's load just before the cache rows' loads that wait on it: a round trip an element
    # in the prologue, ~6.7 us a program by the model)
    p0, p1, p2, p3 = rows
    p = p0[:, None] + ax * 0
    if AXES >= 2:
        p = tl.where(ax == 1, p1[:, None], p)
    if AXES >= 3:
        p = tl.where(ax == 2, p2[:, None], p)
    if AXES >= 4:
        p = tl.where(ax == 3, p3[:, None], p)
    return p


@triton.jit
def _run_rows(t_ptr, p, stride_p, tcols, mask, ok, n_pos, RAW_T: tl.constexpr, RUN: tl.constexpr):
    # a cache at rows p and columns tcols ([BLOCK_R, BLOCK_D]; AXES: RUN-wide vectors, p the same
    # over each RUN columns from a multiple of RUN, stride_p a multiple of RUN:
    # rome.launch.launch_axis_run), in x's register layout (read element by element, the compiler
    # chose a layout of its own: the offsets and masks through shared memory, the values back). A
    # position out of range (not ok) reads row 0 in its place, so the mask keeps its runs whole
    # (the caller makes it NaN: a position outside the cache is never read; n_pos == 0: nothing is)
    off = tl.where(ok, p, 0) * stride_p + tcols
    if RUN > 1:
        off = tl.max_contiguous(tl.multiple_of(off, [1, RUN]), [1, RUN])
    return _load(t_ptr, off, mask & (tl.zeros([1, 1], dtype=tl.int32) < n_pos), RAW_T)


@triton.jit
def _moved_to_src(s, src2, PAIR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # s[:, src] of a row-wise s [BLOCK_R, BLOCK_D] (src2: src in its layout): interleave's pairs
    # swapped (register renames), else one exchange through shared memory
    if PAIR == PAIRS_SWAPPED:
        moved = _pair_swap(s, BLOCK_R, BLOCK_D)
    else:
        moved = tl.gather(s, src2, axis=1)
    return moved


@triton.jit
def _cache_index(p, n_pos, I64: tl.constexpr):
    # positions p (int32 or int64) as the offsets' type (int64 under I64, else int32) and whether
    # each is in [0, n_pos). Narrowed to int32, an int64's high word must be 0 as well (2**32 + 3
    # narrowed is row 3; [2**31, 2**32) narrows negative; n_pos < 2**31 there). (Compared in
    # int64 instead, a [BLOCK_R, BLOCK_D] tile of positions a backward reads cost it 0.3-1.4
    # points of an H200's copy by the model: more instructions)
    if I64:
        p = p.to(tl.int64)
        return p, (p >= 0) & (p < n_pos)
    lo = p.to(tl.int32)
    ok = (lo >= 0) & (lo < n_pos)
    if p.dtype.is_int64():
        ok = ok & ((p >> 32).to(tl.int32) == 0)
    return lo, ok


@triton.jit
def _row_tables(c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc, stride_ps, n_pos,
                axis_ptr, stride_ax, src_ptr, src2, t0, t1, row_ok, mask, cols, cmask, D,
                PAIR: tl.constexpr, POSITIONS: tl.constexpr, ANGLES: tl.constexpr, TRANSPOSE: tl.constexpr,
                SIN_AT_SRC: tl.constexpr, I64: tl.constexpr, RAW_C: tl.constexpr, RAW_S: tl.constexpr,
                F64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, AXES: tl.constexpr = 0,
                pos=None, PRE_POS: tl.constexpr = False, AXIS_RUN: tl.constexpr = 1, S_RUN: tl.constexpr = 1,
                SIN_SRC_FOLD: tl.constexpr = False):
    # cos at (t, j) and sin at (t, scol[j]) of the T rows (t0, t1) as fp32 [BLOCK_R, BLOCK_D], from
    # tables, caches at positions or angles (see _rome_gather_kernel's arguments), and where the
    # sin is read (sp: its rows' positions; s_ok: which are in range). SIN_AT_SRC: sin is left
    # to _signed_sin (0.0 here); a transpose without it (angles, the dot) has sin at src here.
    # src2: src in the tiles' layout (PAIR: how it moves pairs). PRE_POS: the positions already
    # loaded by the caller (``pos``: POSITIONS == 1's [BLOCK_R], AXES's _row_positions). AXIS_RUN:
    # AXES's cache rows as vectors of that many columns (_run_rows); S_RUN: sin at src's;
    # SIN_SRC_FOLD: AXES's transpose reads sin at src (src2), its range left to the caller, which
    # folds s_ok into the sign (_gather_body's rule)
    s = 0.0
    sp = t0
    s_ok = row_ok
    if POSITIONS == 0:  # (sin issued before cos: cos's layout conversion for the pair-class
        # branches, a shared-memory round trip and a barrier, no longer holds sin's load back)
        if not SIN_AT_SRC:
            s = _load(s_ptr, (t0 * sst0 + t1 * sst1)[:, None] + cols[None, :], mask, RAW_S)
        c = _load(c_ptr, (t0 * sct0 + t1 * sct1)[:, None] + cols[None, :], mask, RAW_C)
    else:
        prow = t0 * spt0 + t1 * spt1
        if POSITIONS == 1:
            if PRE_POS:
                cp = pos[:, None]
            else:
                cp = tl.load(p_ptr + prow, mask=row_ok, other=0)[:, None]
            sp = cp
        else:
            if AXES > 0:  # (AXES axes: a row's positions once, _by_axis; the columns'
                # axes in x's layout, as src2: read as a [D] vector, they went through shared
                # memory into the positions' layout, and the cache rows' loads waited on it. Not
                # read at the kernel's top with the row positions: 16 more registers held through
                # the first batch's loads)
                if not PRE_POS:
                    pos = _row_positions(p_ptr, prow, stride_pa, row_ok, AXES)
                cols2 = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.int32) + cols[None, :]
                cp = _by_axis(pos, tl.load(axis_ptr + cols2 * stride_ax, mask=cols2 < D, other=0), AXES)
            else:
                ax = tl.load(axis_ptr + cols * stride_ax, mask=cmask, other=0)
                cp = tl.load(p_ptr + prow[:, None] + ax[None, :] * stride_pa, mask=mask, other=0)
            sp = cp
            if TRANSPOSE and not ANGLES and AXES > 0:  # sin at src: src's axis in x's layout (src2)
                if PAIR != PAIRS_SWAPPED or AXIS_RUN == 1:
                    sp = _by_axis(pos, tl.load(axis_ptr + src2 * stride_ax, mask=src2 < D, other=0), AXES)
            elif TRANSPOSE and not ANGLES:  # (angles: sin at src is moved from the columns' below)
                src = tl.load(src_ptr + cols, mask=cmask, other=0)
                sax = tl.load(axis_ptr + src * stride_ax, mask=cmask, other=0)
                sp = tl.load(p_ptr + prow[:, None] + sax[None, :] * stride_pa, mask=mask, other=0)
        cp, c_ok = _cache_index(cp, n_pos, I64)
        sp, s_ok = _cache_index(sp, n_pos, I64)
        if ANGLES:
            c, s = _angle_tables(c_ptr, stride_pc, s_ptr, stride_ps, cp, c_ok, cols, D, F64)
            if TRANSPOSE:  # sin at (pos[t, axis[src]], src) is the columns' own sin at src: moved
                # there (interleave: a register rename; else one exchange through shared memory),
                # not evaluated again from src's frequency, scale and position (a dependent
                # chain of loads and a second polynomial in the program's prologue)
                s = _moved_to_src(s, src2, PAIR, BLOCK_R, BLOCK_D)
        elif AXES > 0:  # sin at the columns (the forward, sp = cp; the transpose's interleave,
            # whose pairs share their axis, then swapped) or at src (src2: KEPT_RUN's runs), cos at
            # the columns. Out of range: row 0 read, made NaN by adding where(ok, -0.0, nan) after
            # both rows' loads (a select after each load had ptxas (triton 3.9) issue sin's last
            # load only once cos's values were in); sin at src is left to _gather_body, which
            # folds s_ok into the sign (added there, its loads went one round trip each, 3.9)
            bad = tl.where(c_ok, -0.0, float("nan"))  # (v + -0.0 is v, +-0 too)
            if SIN_SRC_FOLD:
                s = _run_rows(s_ptr, sp, stride_ps, src2, mask, s_ok, n_pos, RAW_S, S_RUN)
            else:
                s = _run_rows(s_ptr, cp, stride_ps, cols[None, :], mask, c_ok, n_pos, RAW_S, AXIS_RUN) + bad
            c = _run_rows(c_ptr, cp, stride_pc, cols[None, :], mask, c_ok, n_pos, RAW_C, AXIS_RUN) + bad
            if TRANSPOSE and PAIR == PAIRS_SWAPPED and AXIS_RUN > 1:
                s = _pair_swap(s, BLOCK_R, BLOCK_D)
        else:
            if TRANSPOSE and POSITIONS == 2:  # several axes: sin at (pos[t, axis[src]], src)
                s = _table(s_ptr, sp * stride_ps + src[None, :], mask, s_ok, RAW_S, POSITIONS)
            elif not SIN_AT_SRC:
                s = _table(s_ptr, sp * stride_ps + cols[None, :], mask, s_ok, RAW_S, POSITIONS)
            c = _table(c_ptr, cp * stride_pc + cols[None, :], mask, c_ok, RAW_C, POSITIONS)
    if TRANSPOSE and not SIN_AT_SRC and not ANGLES and POSITIONS != 2:  # the dot's transpose: sin at
        # src is its row's sin, read at the columns above and moved (one exchange through shared
        # memory; read at src per element, its addresses went through shared memory into the
        # dot's layout first and its values waited on: two DRAM round trips in the prologue)
        s = _moved_to_src(s, src2, PAIR, BLOCK_R, BLOCK_D)
    return c, s, sp, s_ok


@triton.jit
def _signed_sin(s, s_ptr, t0, t1, sst0, sst1, stride_ps, sp, s_ok, cols2, src2, sign2, mask,
                PAIR: tl.constexpr, SIN_AT_SRC: tl.constexpr, POSITIONS: tl.constexpr, SIGN: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, RAW_S: tl.constexpr):
    # sin as the rotation multiplies the partner by: the transpose's sin at src (SIN_AT_SRC: read
    # here, where PAIR makes it cheap) and, SIGN, the sign folded in (not for the dot: the matrix
    # holds it; not for the token tile's backward: _token_tile folds it behind its gate)
    if SIN_AT_SRC:  # (PAIRS_SWAPPED: read at the columns themselves, then pairs swapped)
        scols = cols2 if PAIR == PAIRS_SWAPPED else src2
        if POSITIONS == 0:
            s = _load(s_ptr, (t0 * sst0 + t1 * sst1)[:, None] + scols, mask, RAW_S)
        else:
            s = _table(s_ptr, sp * stride_ps + scols, mask, s_ok, RAW_S, POSITIONS)
        if PAIR == PAIRS_SWAPPED:
            s = _pair_swap(s, BLOCK_R, BLOCK_D)
    if SIGN:
        s = s * sign2  # the sign folded into sin (exact): y = x*c + x[:, src]*s
    return s


@triton.jit
def _opaque(v, OPAQUE: tl.constexpr):
    # OPAQUE (NVIDIA): the int32 v through a move the compiler cannot see through, so that what
    # is formed from it is formed where used: not strength-reduced into a register a tensor and a
    # block, nor hoisted out of the token loop (Wan 2.1's token tile held ~25 such offsets a
    # thread: its forward 128 -> 108 registers with it, triton 3.6). ptxas folds a move of a
    # constant back (LLVM's strength reduction was the cost, not the constant)
    if OPAQUE:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)
    return v


@triton.jit
def _block_heads(b: tl.constexpr, HEADS_B: tl.constexpr, t, OPAQUE: tl.constexpr):
    # block b's first head (b * HEADS_B) [1], OPAQUE: for the compiler a value of the token t, so
    # a block's offsets (this times a head stride, plus the thread's own, one register for all
    # blocks) are formed in the loop where used
    first = tl.zeros([1], tl.int32) + b * HEADS_B
    if OPAQUE:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [first, t.to(tl.int32)], dtype=tl.int32,
                                         is_pure=True, pack=1)
    return first


@triton.jit
def _pair_swap_heads(v, BLOCK_R: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    # _pair_swap of a block of heads [BLOCK_R, HEADS, BLOCK_D] (register renames, no instruction)
    a, b = tl.split(tl.reshape(v, [BLOCK_R, HEADS, BLOCK_D // 2, 2]))
    return tl.reshape(tl.join(b, a), [BLOCK_R, HEADS, BLOCK_D])


@triton.jit
def _token_rows(tile, c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc, stride_ps,
                n_pos, axis_ptr, stride_ax, src_ptr, cols, cmask, cols2, src2, sign2, n_t, T1, D,
                PAIR: tl.constexpr, POSITIONS: tl.constexpr, ANGLES: tl.constexpr, TRANSPOSE: tl.constexpr,
                BLOCK_D: tl.constexpr, I64: tl.constexpr, RAW_C: tl.constexpr, RAW_S: tl.constexpr,
                F64: tl.constexpr, OPAQUE: tl.constexpr):
    # token ``tile``'s row (t0, t1) and its cos and signed sin [1, BLOCK_D]. A token past the last
    # is read as the last (clamped: every token's loads are in range and unmasked; the caller
    # never uses such a token's results). OPAQUE: the offsets formed from the token are not
    # strength-reduced (_opaque)
    SIN_AT_SRC: tl.constexpr = TRANSPOSE and not ANGLES and POSITIONS != 2
    t = _opaque(tl.minimum(tile + tl.arange(0, 1), n_t - 1), OPAQUE)
    row_ok = tl.full([1], True, tl.int1)
    t0 = t // T1
    t1 = t % T1
    if I64:
        t0 = t0.to(tl.int64)
        t1 = t1.to(tl.int64)
    mask = row_ok[:, None] & cmask[None, :]
    c, s, sp, s_ok = _row_tables(c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc,
                                 stride_ps, n_pos, axis_ptr, stride_ax, src_ptr, src2, t0, t1, row_ok, mask, cols,
                                 cmask, D, PAIR, POSITIONS, ANGLES, TRANSPOSE, SIN_AT_SRC, I64, RAW_C, RAW_S, F64, 1,
                                 BLOCK_D)
    # (TRANSPOSE: the sign is folded in by _token_tile, behind its gate: folded here, the multiply
    # waited on the token's loads from inside the previous token's math)
    s = _signed_sin(s, s_ptr, t0, t1, sst0, sst1, stride_ps, sp, s_ok, cols2, src2, sign2, mask, PAIR, SIN_AT_SRC,
                    POSITIONS, not TRANSPOSE, 1, BLOCK_D, RAW_S)
    return t0, t1, c, s


@triton.jit
def _token_offsets(t0, t1, st0, st1, sh, hl, b: tl.constexpr, HEADS_B: tl.constexpr, OPAQUE: tl.constexpr):
    # block b's offsets of the token's row (t0, t1) in a tensor of token strides st0, st1 and head
    # stride sh [1, HEADS_B, 1]: the block's first head (_block_heads: formed here, where used)
    # plus the thread's heads hl [HEADS_B]
    return (t0 * st0 + t1 * st1 + _block_heads(b, HEADS_B, t0, OPAQUE) * sh)[:, None, None] + (hl * sh)[None, :, None]


@triton.jit
def _token_x(x_ptr, xn_ptr, t0, t1, sxt0, sxt1, sxh, hl, hm, cols, BLOCKS: tl.constexpr,
             HEADS_B: tl.constexpr, TRANSPOSE: tl.constexpr, RAW_X: tl.constexpr, OPAQUE: tl.constexpr):
    # a token's x by blocks of heads (hm: the blocks' masks [HEADS_B, BLOCK_D], constant where the
    # heads fill them: FULL), with TRANSPOSE also the forward's input xn: tuples of BLOCKS (x's
    # offsets are formed again where used, from the token's row: held through the loop they
    # cost registers a block)
    xs = ()
    xns = ()
    for b in tl.static_range(BLOCKS):
        off = _token_offsets(t0, t1, sxt0, sxt1, sxh, hl, b, HEADS_B, OPAQUE) + cols[None, None, :]
        x = _fetch(x_ptr, off, hm[b][None, :, :], RAW_X)
        xn = x
        if TRANSPOSE:
            xn = _fetch(xn_ptr, off, hm[b][None, :, :], RAW_X)
        xs = xs + (x,)
        xns = xns + (xn,)
    return xs, xns


@triton.jit
def _token_terms(x, xn, xrow, m, c3, s3, x_ptr, src, nw, p, q, FIRST: tl.constexpr, PAIR: tl.constexpr,
                 TRANSPOSE: tl.constexpr, HEADS_B: tl.constexpr, BLOCK_D: tl.constexpr, RAW_X: tl.constexpr,
                 F64: tl.constexpr):
    # a block of heads' terms of the token's statistics added to p and q (FIRST: they start
    # them), elementwise (the blocks share a layout: their sums meet in one reduction): forward
    # p += x² (g: x as loaded, widened again where used); TRANSPOSE: g = the transposed rotation
    # of dy (= x here; its partner read now, x's lines: L1 hits), p += xn², q += g·w·xn. g by
    # _dot2_short where dy is bf16: its error (<= 2**-14 |g| where g cancels to its least, else
    # about 2**-24 |g|) is within dx's own, dx = rstd·w·g − xn·k3 rounding its terms in fp32 (and
    # unbounded against dx where they cancel); 8 instructions an element fewer than _dot2. The
    # sums by fma: one rounding fewer a term
    xw = _widen(x, RAW_X)
    if TRANSPOSE:
        if PAIR == PAIRS_SWAPPED:
            r = _pair_swap_heads(xw, 1, HEADS_B, BLOCK_D)
        else:
            r = _widen(_fetch(x_ptr, xrow + src[None, None, :], m, RAW_X), RAW_X)
        if RAW_X or x.dtype == tl.bfloat16:
            g = _dot2_short(xw, c3, r, s3, F64)
        else:
            g = _dot2(xw, c3, r, s3, F64)
        xi = _widen(xn, RAW_X)
        if FIRST:
            p = xi * xi
            q = g * nw * xi
        else:
            p = tl.fma(xi, xi, p)
            q = tl.fma(g * nw, xi, q)
    else:
        g = x
        if FIRST:
            p = xw * xw
        else:
            p = tl.fma(xw, xw, p)
    return g, p, q


@triton.jit
def _token_apply(g, xn, xrow, m, c3, s3, rstd, k3, orow, x_ptr, o_ptr, cols, src, nw, nws, dw,
                 PAIR: tl.constexpr, TRANSPOSE: tl.constexpr, HEADS_B: tl.constexpr, BLOCK_D: tl.constexpr,
                 RAW_X: tl.constexpr, F64: tl.constexpr, OPAQUE: tl.constexpr):
    # a block of heads' output from its _token_terms value g (forward: x as loaded) and the token's
    # rstd (and TRANSPOSE: k3 = rstd³·Σ(g·w·xn)/N), stored at orow (the block's out offsets
    # [1, HEADS_B, 1]); returns dw with its terms added. OPAQUE, bf16: xn widened here from its
    # bits, an operation other than the statistics' widening, so the two are not merged into one
    # fp32 copy held through the reduction (twice the registers of the packed bf16)
    if TRANSPOSE:
        if OPAQUE and xn.dtype == tl.bfloat16:
            xi = (xn.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        else:
            xi = _widen(xn, RAW_X)
        y = tl.fma(xi, k3 * -1.0, rstd * (g * nw))
        dw = tl.fma(g * xi, rstd, dw)
    else:
        xw = _widen(g, RAW_X) * rstd * nw
        if PAIR == PAIRS_SWAPPED:
            r = _pair_swap_heads(xw, 1, HEADS_B, BLOCK_D)
        else:  # (the partner: x's lines, L1 hits)
            r = _widen(_fetch(x_ptr, xrow + src[None, None, :], m, RAW_X), RAW_X) * rstd * nws
        y = _dot2_short(xw, c3, r, s3, F64)  # (normalised values: see _dot2_short)
    _store(o_ptr, orow + cols[None, None, :], y, m, RAW_X)
    return dw


@triton.jit
def _token_tile(xs, xns, t0, t1, c, s, sign2, x_ptr, o_ptr, sxt0, sxt1, sot0, sot1, sxh, soh, hl, hm,
                cols, src, nw, nws, nw_ptr, D, n, eps, dw, after, PAIR: tl.constexpr, TRANSPOSE: tl.constexpr,
                HEADS_B: tl.constexpr, BLOCKS: tl.constexpr, BLOCK_D: tl.constexpr, RAW_X: tl.constexpr,
                F64: tl.constexpr, OPAQUE: tl.constexpr):
    # one token from its loads (_token_x's tuples): the statistics over its blocks, then each
    # block's output; returns the blocks' dw sums (tuples, as nw, nws, dw) and the token's
    # rstd. TRANSPOSE: the loads' first uses wait for ``after`` (the previous token's rstd, true
    # at run time whatever it is, which the compiler cannot know): ptxas otherwise moved them up
    # into the previous token's math, right behind the loads, and waited a round trip on each
    # of the blocks there (the static model's 42% of copy for Wan 2.1's backward, 3.9). The
    # sign is folded into sin here, behind that gate (sign2: _token_rows leaves it): folded
    # with the load, its multiply was moved into the previous token's reduction and waited
    # there on all of the token's loads (one scoreboard; Wan 2.1 backward 78.7 -> 81.5% by the
    # model, triton 3.6)
    c3 = c[:, None, :]
    s3 = s[:, None, :]
    if TRANSPOSE:
        ok = (after >= 0.0) | (after != after)
        c3 = tl.where(ok, c3, 0.0)
        s3 = tl.where(ok, s3, 0.0) * sign2[:, None, :]
    p = tl.zeros([1, HEADS_B, BLOCK_D], dtype=tl.float32)
    q = p
    gs = ()
    for b in tl.static_range(BLOCKS):
        g, p, q = _token_terms(xs[b], xns[b], _token_offsets(t0, t1, sxt0, sxt1, sxh, hl, b, HEADS_B, OPAQUE),
                               hm[b][None, :, :], c3, s3, x_ptr, src,
                               _token_weights(nw, nw_ptr, b, hl, hm, cols, D, t0, TRANSPOSE, HEADS_B, OPAQUE), p, q,
                               b == 0, PAIR, TRANSPOSE, HEADS_B, BLOCK_D, RAW_X, F64)
        gs = gs + (g,)
    if TRANSPOSE:  # both sums in one reduction (one pass through shared memory, one barrier pair)
        sp, sq = tl.reduce((tl.reshape(p, [HEADS_B * BLOCK_D]),
                            tl.reshape(q, [HEADS_B * BLOCK_D])), 0, _sum_pair)
        rstd = _rstd(sp / n, eps)
        k3 = rstd * rstd * rstd * sq / n
    else:
        rstd = _rstd(tl.sum(p) / n, eps)
        k3 = rstd  # (unused)
    out = ()
    for b in tl.static_range(BLOCKS):
        out = out + (_token_apply(gs[b], xns[b], _token_offsets(t0, t1, sxt0, sxt1, sxh, hl, b, HEADS_B, OPAQUE),
                                  hm[b][None, :, :], c3, s3, rstd, k3,
                                  _token_offsets(t0, t1, sot0, sot1, soh, hl, b, HEADS_B, OPAQUE), x_ptr, o_ptr,
                                  cols, src, _token_weights(nw, nw_ptr, b, hl, hm, cols, D, t0, TRANSPOSE, HEADS_B,
                                                            OPAQUE),
                                  nws[b], dw[b], PAIR, TRANSPOSE, HEADS_B, BLOCK_D, RAW_X, F64, OPAQUE),)
    return out, rstd


@triton.jit
def _token_weights(nw, nw_ptr, b: tl.constexpr, hl, hm, cols, D, t, REREAD: tl.constexpr, HEADS_B: tl.constexpr,
                   OPAQUE: tl.constexpr):
    # block b's weights [1, HEADS_B, BLOCK_D]: held (nw[b]) or, REREAD, read again where used, for
    # token t (L1 hits after the program's first token: registers freed for the token in flight)
    if REREAD:
        w = tl.load(nw_ptr + _block_heads(b, HEADS_B, t, OPAQUE) * D + (hl[:, None] * D + cols[None, :])[None, :, :],
                    mask=hm[b][None, :, :], other=0.0)
    else:
        w = nw[b]
    return w


@triton.jit
def _sum_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _token_heads(c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc, stride_ps, n_pos,
                 axis_ptr, stride_ax, src_ptr, sign_ptr, n_t, T1,
                 x_ptr, o_ptr, sxt0, sxt1, sot0, sot1, sxh0, soh0, H, D, nw_ptr, eps, xn_ptr, dw_ptr,
                 PAIR: tl.constexpr, POSITIONS: tl.constexpr, ANGLES: tl.constexpr, TRANSPOSE: tl.constexpr,
                 HEADS_B: tl.constexpr, BLOCKS: tl.constexpr, BLOCK_D: tl.constexpr, I64: tl.constexpr,
                 RAW_X: tl.constexpr, RAW_C: tl.constexpr, RAW_S: tl.constexpr, F64: tl.constexpr,
                 OPAQUE: tl.constexpr, FULL: tl.constexpr):
    # RMSNorm over all H heads of a token, then the rotation (forward), or the transposed
    # rotation then the norm's backward (TRANSPOSE, x = dy): the token tile. A token's H x D values
    # are held in registers as BLOCKS blocks of HEADS_B heads (a power of two; blocks past H
    # masked): one shape, so one register layout for all and the token's cos/sin row held once
    # for them (Wan 2.1's 40 heads: 5 x 8, 20 values a thread over 8 warps, nothing masked; one
    # tile of 64 heads idled 37% of the lanes and spilled). The token's statistics are one
    # reduction over the blocks, so x is read once (the head-group walk reads each token twice).
    # The heads are one dimension (H1 == 1: the launcher's token tile), of stride sxh0 / soh0.
    # N = H*D values per token, w the weights [H*D] head-major:
    #   forward  x̂ = x * rstd * w, rstd = 1/sqrt(Σx²/N + eps);  y = x̂*c + x̂[..., src]*s
    #   backward g = dy*c + (dy*s)@Mᵀ;  dx = rstd*g*w − x*rstd³*Σ(g*w*x)/N;  dw += Σ_tokens g*x*rstd
    # The program walks tokens pid, pid + P, ... (persistent: the weights read once and held; the
    # backward's dw sums held in registers and stored once, to row pid of dw_ptr [programs, 2,
    # H*D]), two tokens an iteration as a ping-pong: token b's loads (x, xn, its tables) issued
    # before token a's math, then the next a's before b's, so one token is in flight through each
    # token's math and no register is copied at the back edge (a copy of a loaded register waits
    # for its load: a next token taken over at the iteration's end cost a round trip a token).
    # The loop takes whole pairs; an odd count's last token is the tail after it (its loads
    # issued by the last iteration). No load or store in the loop is masked: every token's row
    # is clamped into range (_token_rows; the tail's look-ahead reads the last token again) and,
    # FULL (the heads fill the blocks, D == BLOCK_D), nothing is masked at all. The masks of a
    # token past the end cost ~2 instructions an element (zeroing each load's registers, the
    # predicates) and ~10 registers a thread (predicates moved to registers): with them the
    # backward at 8 warps spilled 40-88 B (profiling/results/cpu/token-unmasked/). Per element:
    # x read and y written once (the backward: dy and x read, dx written); the tables per token
    # (8 B a column, shared by the H heads). Bound by DRAM bandwidth where the tokens in flight
    # per SM (two programs, 20 KB each at Wan 2.1's 40 x 128 bf16 backward) cover the latency,
    # else by instruction issue (~25 an element).
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    if FULL:
        cmask = tl.full([BLOCK_D], True, tl.int1)
    src = tl.where(cmask, tl.load(src_ptr + cols, mask=cmask, other=0), cols)  # (past D: j itself)
    if PAIR == PAIRS_KEPT:  # (src in 2-element runs from even columns: one load per pair)
        src = tl.max_contiguous(tl.multiple_of(((src >> 1) << 1) | (cols & 1), [2]), [2])
    # the per-column vectors as the kernel's prologue holds them ([1, BLOCK_D]: _signed_sin)
    cols2 = tl.zeros([1, BLOCK_D], dtype=tl.int32) + cols[None, :]
    src2 = tl.zeros([1, BLOCK_D], dtype=tl.int32) + src[None, :]
    sign2 = tl.load(sign_ptr + cols2, mask=cols2 < D, other=0.0)
    # the thread's heads in a block, hl [HEADS_B] (a block's offsets: _token_offsets); per block
    # the mask [HEADS_B, BLOCK_D], the weights at the columns and at src ([1, HEADS_B, BLOCK_D]
    # fp32, read once per program; the partner's at src: swapped, in registers), the dw sums
    hl = tl.arange(0, HEADS_B)
    if I64:
        hl = hl.to(tl.int64)
    hm = ()
    nw = ()
    nws = ()
    dw = ()
    for b in tl.static_range(BLOCKS):
        h = b * HEADS_B + tl.arange(0, HEADS_B)
        m = (h < H)[:, None] & cmask[None, :]
        if FULL:
            m = tl.full([HEADS_B, BLOCK_D], True, tl.int1)
        hm = hm + (m,)
        if TRANSPOSE:  # (the backward reads them where used: _token_weights; the tuples unused)
            nw = nw + (m,)
            nws = nws + (m,)
        else:
            w = tl.load(nw_ptr + (h[:, None] * D + cols[None, :])[None, :, :], mask=m[None, :, :], other=0.0)
            nw = nw + (w,)
            if PAIR != PAIRS_SWAPPED:
                w = tl.load(nw_ptr + (h[:, None] * D + src[None, :])[None, :, :], mask=m[None, :, :], other=0.0)
            nws = nws + (w,)
        dw = dw + (tl.zeros([1, HEADS_B, BLOCK_D], dtype=tl.float32),)
    n = (H * D).to(tl.float32)
    after = tl.sum(tl.zeros([1], dtype=tl.float32))  # (the first token waits for nothing)
    # token a: the program's first (the launcher's programs are at most the tokens: in range)
    a0, a1, ca, sa = _token_rows(tl.program_id(0), c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1,
                                 stride_pa, stride_pc, stride_ps, n_pos, axis_ptr, stride_ax, src_ptr, cols, cmask,
                                 cols2, src2, sign2, n_t, T1, D, PAIR, POSITIONS, ANGLES, TRANSPOSE, BLOCK_D, I64,
                                 RAW_C, RAW_S, F64, OPAQUE)
    xa, na = _token_x(x_ptr, xn_ptr, a0, a1, sxt0, sxt1, sxh0, hl, hm, cols, BLOCKS, HEADS_B, TRANSPOSE, RAW_X,
                      OPAQUE)
    for i in range(tl.program_id(0), n_t - step, 2 * step):  # (token i + step exists)
        # token b's loads, then token a's math
        b0, b1, cb, sb = _token_rows(i + step, c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1,
                                     stride_pa, stride_pc, stride_ps, n_pos, axis_ptr, stride_ax, src_ptr, cols,
                                     cmask, cols2, src2, sign2, n_t, T1, D, PAIR, POSITIONS, ANGLES, TRANSPOSE,
                                     BLOCK_D, I64, RAW_C, RAW_S, F64, OPAQUE)
        xb, nb = _token_x(x_ptr, xn_ptr, b0, b1, sxt0, sxt1, sxh0, hl, hm, cols, BLOCKS, HEADS_B, TRANSPOSE,
                          RAW_X, OPAQUE)
        if TRANSPOSE:  # (the loads stay above: ptxas sank them into the math, to just before their use)
            tl.debug_barrier()
        dw, after = _token_tile(xa, na, a0, a1, ca, sa, sign2, x_ptr, o_ptr, sxt0, sxt1, sot0, sot1, sxh0, soh0,
                                hl, hm, cols, src, nw, nws, nw_ptr, D, n, eps, dw, after, PAIR, TRANSPOSE, HEADS_B,
                                BLOCKS, BLOCK_D, RAW_X, F64, OPAQUE)
        # the next token a's loads (past the last: the last again, for the tail), then token b's math
        a0, a1, ca, sa = _token_rows(i + 2 * step, c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1,
                                     stride_pa, stride_pc, stride_ps, n_pos, axis_ptr, stride_ax, src_ptr, cols,
                                     cmask, cols2, src2, sign2, n_t, T1, D, PAIR, POSITIONS, ANGLES, TRANSPOSE,
                                     BLOCK_D, I64, RAW_C, RAW_S, F64, OPAQUE)
        xa, na = _token_x(x_ptr, xn_ptr, a0, a1, sxt0, sxt1, sxh0, hl, hm, cols, BLOCKS, HEADS_B, TRANSPOSE,
                          RAW_X, OPAQUE)
        if TRANSPOSE:
            tl.debug_barrier()
        dw, after = _token_tile(xb, nb, b0, b1, cb, sb, sign2, x_ptr, o_ptr, sxt0, sxt1, sot0, sot1, sxh0, soh0,
                                hl, hm, cols, src, nw, nws, nw_ptr, D, n, eps, dw, after, PAIR, TRANSPOSE, HEADS_B,
                                BLOCKS, BLOCK_D, RAW_X, F64, OPAQUE)
    # the tail: the program's last token where its count is odd, loaded and rotated here (the
    # loop's look-ahead of it is not used: taken over, its registers were held through the
    # loop's exit and ptxas spilled 32 B in Wan 2.1's backward)
    last = tl.program_id(0) + 2 * step * (tl.maximum(n_t - step - tl.program_id(0) + 2 * step - 1, 0) // (2 * step))
    if last < n_t:
        a0, a1, ca, sa = _token_rows(last, c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa,
                                     stride_pc, stride_ps, n_pos, axis_ptr, stride_ax, src_ptr, cols, cmask, cols2,
                                     src2, sign2, n_t, T1, D, PAIR, POSITIONS, ANGLES, TRANSPOSE, BLOCK_D, I64,
                                     RAW_C, RAW_S, F64, OPAQUE)
        xa, na = _token_x(x_ptr, xn_ptr, a0, a1, sxt0, sxt1, sxh0, hl, hm, cols, BLOCKS, HEADS_B, TRANSPOSE,
                          RAW_X, OPAQUE)
        dw, after = _token_tile(xa, na, a0, a1, ca, sa, sign2, x_ptr, o_ptr, sxt0, sxt1, sot0, sot1, sxh0, soh0,
                                hl, hm, cols, src, nw, nws, nw_ptr, D, n, eps, dw, after, PAIR, TRANSPOSE, HEADS_B,
                                BLOCKS, BLOCK_D, RAW_X, F64, OPAQUE)
    if TRANSPOSE:
        row = tl.program_id(0) * 2 * H * D
        for b in tl.static_range(BLOCKS):  # (offsets formed here, after the loop: not held through it)
            first = _block_heads(b, HEADS_B, after.to(tl.int32, bitcast=True), OPAQUE)
            tl.store(dw_ptr + row + first * D + (hl[:, None] * D + cols[None, :])[None, :, :], dw[b],
                     mask=hm[b][None, :, :])


# --- the half rotation of the whole head as its two halves (HALVES) ---------------------------
# src[j] = (j + D/2) % D with D = BLOCK_D (llama's, NeoX's rotate_half): each column's partner
# is in the other half, so a head's tile is held as its halves A = x[:, :D/2] and B = x[:, D/2:],
#     out[:, :D/2] = A*cos[:, :D/2] + B*s_A      out[:, D/2:] = B*cos[:, D/2:] + A*s_B
# with s_A, s_B the signed sin at the halves (the transpose's at src: the other half). Every
# loaded byte is a distinct byte of x: no partner load, no register holding a second copy of
# the head, so twice the head rows in the same registers (16 rows x 128 bf16 on 4 warps: 16 B
# vectors per half) and twice the bytes in flight. Bound by DRAM bandwidth once the heads in
# flight cover the latency: three heads a batch prefetched for bf16 (four spilled 8-16 B), two
# for fp16 (_dot2's sum), 4 programs an SM at 128 registers (the model, llama-1d, sm_90 bf16, 800 ns: 39-43 KB an SM in flight under
# triton 3.6 and 3.9, where the partner form held 23-26 under 3.6). profiling/results/cpu/halves/
# Any src that pairs every column with another (src[src[j]] == j != src[j]: each axis's half
# rotation of its own section, default's 44/44/40) is held the same way with A and B the pairs'
# two columns read from a table (``HALVES_RUN`` > 0: src_ptr holds acol [D/2] then bcol =
# src[acol] [D/2], in runs of HALVES_RUN columns from multiples of it, rome.launch.halves_pairs):
# loads HALVES_RUN elements wide (default's 22-column halves: 4 B in bf16) and the tile rows of the
# partner form, whose x and partner registers now hold two heads' distinct bytes.


@triton.jit
def _halves_fetch(x_ptr, x_off, xb_off, m, SHIFT: tl.constexpr, RAW_X: tl.constexpr):
    # a head's two halves, in x's dtype until used (B at x_ptr + SHIFT + xb_off: the whole head's
    # at SHIFT = D/2, xb_off = x_off; the pairs' at their own columns, SHIFT = 0)
    return _fetch(x_ptr, x_off, m, RAW_X), _fetch(x_ptr + SHIFT, xb_off, m, RAW_X)


@triton.jit
def _halves_head(o_ptr, o_off, ob_off, m, a, b, ca, cb, sa, sb, SHIFT: tl.constexpr, RAW_X: tl.constexpr,
                 F64: tl.constexpr):
    # one head's math and stores from its halves a, b (the sums as _head's: _rotated)
    xa = _widen(a, RAW_X)
    xb = _widen(b, RAW_X)
    _store(o_ptr, o_off, _rotated(xa, ca, xb, sa, a, o_ptr, True, RAW_X, F64), m, RAW_X)
    _store(o_ptr + SHIFT, ob_off, _rotated(xb, cb, xa, sb, b, o_ptr, True, RAW_X, F64), m, RAW_X)


@triton.jit
def _halves_batch(x_ptr, x_off, xb_off, sxh0, sxh1, H1, ha, hb, h, h_hi, mask, K: tl.constexpr,
                  SHIFT: tl.constexpr, RAW_X: tl.constexpr):
    # the halves of heads h .. h + K - 1 (the first at head indices (ha, hb); none past h_hi):
    # returns the last one's indices and the batch's halves (six heads' places, the unused ones
    # the first's)
    a0, b0 = _halves_fetch(x_ptr + (ha * sxh0 + hb * sxh1), x_off, xb_off, _while(mask, h, h_hi), SHIFT, RAW_X)
    a1, b1, a2, b2, a3, b3, a4, b4, a5, b5 = a0, b0, a0, b0, a0, b0, a0, b0, a0, b0
    for i in tl.static_range(1, K):
        ha, hb = _next_head(ha, hb, H1)
        u, v = _halves_fetch(x_ptr + (ha * sxh0 + hb * sxh1), x_off, xb_off, _while(mask, h + i, h_hi), SHIFT,
                             RAW_X)
        if i == 1:
            a1, b1 = u, v
        elif i == 2:
            a2, b2 = u, v
        elif i == 3:
            a3, b3 = u, v
        elif i == 4:
            a4, b4 = u, v
        else:
            a5, b5 = u, v
    return ha, hb, (a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5)


@triton.jit
def _halves_loop(x_ptr, o_ptr, x_off, xb_off, o_off, ob_off, sxh0, sxh1, soh0, soh1, H1, h_lo, h_hi, mask,
                 ca, cb, sa, sb, pre, LOADED: tl.constexpr, K: tl.constexpr, SHIFT: tl.constexpr,
                 RAW_X: tl.constexpr, F64: tl.constexpr):
    # heads [h_lo, h_hi) of one tensor (h = ha * H1 + hb), K a batch: the first batch's halves
    # (LOADED: issued by the caller, ``pre``), then per iteration the next batch's issued before
    # this batch's math and taken over at the iteration's end (as _rotate_heads); heads past
    # h_hi: no loads, no stores
    hc = h_lo // H1  # the head stored next
    hd = h_lo % H1
    if not LOADED:
        _, _, pre = _halves_batch(x_ptr, x_off, xb_off, sxh0, sxh1, H1, hc, hd, h_lo, h_hi, mask, K, SHIFT, RAW_X)
    a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5 = pre
    ha = hc  # (ha, hb): the batch's last head
    hb = hd
    for i in tl.static_range(1, K):
        ha, hb = _next_head(ha, hb, H1)
    for h in range(h_lo, h_hi, K):
        # the next batch's loads
        ha, hb = _next_head(ha, hb, H1)
        ha, hb, nxt = _halves_batch(x_ptr, x_off, xb_off, sxh0, sxh1, H1, ha, hb, h + K, h_hi, mask, K, SHIFT,
                                    RAW_X)
        # this batch
        _halves_head(o_ptr + (hc * soh0 + hd * soh1), o_off, ob_off, _while(mask, h, h_hi), a0, b0, ca, cb, sa, sb,
                     SHIFT, RAW_X, F64)
        hc, hd = _next_head(hc, hd, H1)
        if K >= 2:
            _halves_head(o_ptr + (hc * soh0 + hd * soh1), o_off, ob_off, _while(mask, h + 1, h_hi), a1, b1, ca, cb,
                         sa, sb, SHIFT, RAW_X, F64)
            hc, hd = _next_head(hc, hd, H1)
        if K >= 3:
            _halves_head(o_ptr + (hc * soh0 + hd * soh1), o_off, ob_off, _while(mask, h + 2, h_hi), a2, b2, ca, cb,
                         sa, sb, SHIFT, RAW_X, F64)
            hc, hd = _next_head(hc, hd, H1)
        if K >= 4:
            _halves_head(o_ptr + (hc * soh0 + hd * soh1), o_off, ob_off, _while(mask, h + 3, h_hi), a3, b3, ca, cb,
                         sa, sb, SHIFT, RAW_X, F64)
            hc, hd = _next_head(hc, hd, H1)
        if K >= 5:
            _halves_head(o_ptr + (hc * soh0 + hd * soh1), o_off, ob_off, _while(mask, h + 4, h_hi), a4, b4, ca, cb,
                         sa, sb, SHIFT, RAW_X, F64)
            hc, hd = _next_head(hc, hd, H1)
        if K >= 6:
            _halves_head(o_ptr + (hc * soh0 + hd * soh1), o_off, ob_off, _while(mask, h + 5, h_hi), a5, b5, ca, cb,
                         sa, sb, SHIFT, RAW_X, F64)
            hc, hd = _next_head(hc, hd, H1)
        a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5 = nxt


@triton.jit
def _halves_heads(src_ptr, sign_ptr, c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc,
                  stride_ps, n_pos, axis_ptr, stride_ax, t0, t1, row_ok, h_lo, h_hi,
                  a_x, a_o, a_sxt0, a_sxt1, a_sot0, a_sot1, a_sxh0, a_sxh1, a_soh0, a_soh1, a_H, a_H1,
                  b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0, b_sxh1, b_soh0, b_soh1, b_H1,
                  POSITIONS: tl.constexpr, TRANSPOSE: tl.constexpr, HALF: tl.constexpr, I64: tl.constexpr,
                  RAW_X: tl.constexpr, RAW_C: tl.constexpr, RAW_S: tl.constexpr, F64: tl.constexpr,
                  K: tl.constexpr, RUN: tl.constexpr, AXES: tl.constexpr, AXIS_RUN: tl.constexpr):
    # the program's T rows (t0, t1; row_ok) of heads [h_lo, h_hi) of q's then k's (the kernel's
    # prologue: a group of k's heads has k's arguments in q's places, its head strides int64 under
    # I64); cos/sin per T row (POSITIONS == 0: tables; 1: cache rows pos[t]; 2, the pairs only:
    # cache rows pos[t, axis[j]] on AXES axes, a row's positions read once an axis and a column's
    # picked by its axis, A's and B's each their own; a position outside the cache never read:
    # NaN), read once for the program's heads after q's first batch.
    # RUN == 0: A and B the whole head's halves (B at + HALF); else the pairs' columns acol, bcol
    # (src_ptr's [D/2] each, runs of RUN)
    cols = tl.arange(0, HALF)
    mask = row_ok[:, None] & (cols < HALF)[None, :]
    SHIFT: tl.constexpr = HALF if RUN == 0 else 0  # (B's columns: cb + SHIFT)
    if RUN == 0:
        ca = cols
        cb = cols
    else:
        ca = tl.max_contiguous(tl.multiple_of(tl.load(src_ptr + cols), RUN), RUN)
        cb = tl.max_contiguous(tl.multiple_of(tl.load(src_ptr + HALF + cols), RUN), RUN)
    # q's first batch, issued before the tables
    axrow = (t0 * a_sxt0 + t1 * a_sxt1)[:, None]
    ax_off = axrow + ca[None, :]
    axb_off = axrow + cb[None, :]
    q_lo = tl.minimum(h_lo, a_H)
    q_hi = tl.minimum(h_hi, a_H)
    _, _, pre = _halves_batch(a_x, ax_off, axb_off, a_sxh0, a_sxh1, a_H1, q_lo // a_H1, q_lo % a_H1, q_lo, q_hi,
                              mask, K, SHIFT, RAW_X)
    # cos at the halves, and sin as the partner multiplies: at the other half in the transpose
    # (scol = src), times the sign of each output column
    if POSITIONS == 2:  # (A's rows and B's: a pair's columns may lie on two axes; out of range:
        # row 0 read, made NaN by adding where(ok, -0.0, nan), as _row_tables' AXES)
        tl.static_assert(RUN > 0 and AXES > 0, "HALVES at positions on several axes: the pairs' build, AXES")
        TRUN: tl.constexpr = RUN if RUN < AXIS_RUN else AXIS_RUN  # (the caches' vectors: both runs')
        rows = _row_positions(p_ptr, t0 * spt0 + t1 * spt1, stride_pa, row_ok, AXES)
        zero = tl.zeros_like(mask.to(tl.int32))
        pa, oka = _cache_index(_by_axis(rows, tl.load(axis_ptr + (zero + ca[None, :]) * stride_ax), AXES), n_pos, I64)
        pb, okb = _cache_index(_by_axis(rows, tl.load(axis_ptr + (zero + cb[None, :]) * stride_ax), AXES), n_pos, I64)
        bad_a = tl.where(oka, -0.0, float("nan"))  # (v + -0.0 is v, +-0 too)
        bad_b = tl.where(okb, -0.0, float("nan"))
        c_a = _run_rows(c_ptr, pa, stride_pc, ca[None, :], mask, oka, n_pos, RAW_C, TRUN) + bad_a
        c_b = _run_rows(c_ptr, pb, stride_pc, cb[None, :], mask, okb, n_pos, RAW_C, TRUN) + bad_b
        s_lo = _run_rows(s_ptr, pa, stride_ps, ca[None, :], mask, oka, n_pos, RAW_S, TRUN) + bad_a
        s_hi = _run_rows(s_ptr, pb, stride_ps, cb[None, :], mask, okb, n_pos, RAW_S, TRUN) + bad_b
    else:
        if POSITIONS == 0:
            crow = (t0 * sct0 + t1 * sct1)[:, None]
            srow = (t0 * sst0 + t1 * sst1)[:, None]
            ok = mask
        else:
            p, ok = _cache_index(tl.load(p_ptr + (t0 * spt0 + t1 * spt1), mask=row_ok, other=0), n_pos, I64)
            ok = ok[:, None] & mask
            crow = (p * stride_pc)[:, None]
            srow = (p * stride_ps)[:, None]
        c_a = _table(c_ptr, crow + ca[None, :], mask, ok, RAW_C, POSITIONS)
        c_b = _table(c_ptr + SHIFT, crow + cb[None, :], mask, ok, RAW_C, POSITIONS)
        s_lo = _table(s_ptr, srow + ca[None, :], mask, ok, RAW_S, POSITIONS)
        s_hi = _table(s_ptr + SHIFT, srow + cb[None, :], mask, ok, RAW_S, POSITIONS)
    sign_a = tl.load(sign_ptr + ca)[None, :]
    sign_b = tl.load(sign_ptr + SHIFT + cb)[None, :]
    if TRANSPOSE:
        sa = s_hi * sign_a
        sb = s_lo * sign_b
    else:
        sa = s_lo * sign_a
        sb = s_hi * sign_b
    aorow = (t0 * a_sot0 + t1 * a_sot1)[:, None]
    _halves_loop(a_x, a_o, ax_off, axb_off, aorow + ca[None, :], aorow + cb[None, :], a_sxh0, a_sxh1, a_soh0,
                 a_soh1, a_H1, q_lo, q_hi, mask, c_a, c_b, sa, sb, pre, True, K, SHIFT, RAW_X, F64)
    bxrow = (t0 * b_sxt0 + t1 * b_sxt1)[:, None]
    borow = (t0 * b_sot0 + t1 * b_sot1)[:, None]
    _halves_loop(b_x, b_o, bxrow + ca[None, :], bxrow + cb[None, :], borow + ca[None, :], borow + cb[None, :],
                 b_sxh0, b_sxh1, b_soh0, b_soh1, b_H1, tl.maximum(h_lo, a_H) - a_H, h_hi - a_H, mask,
                 c_a, c_b, sa, sb, pre, False, K, SHIFT, RAW_X, F64)


@triton.jit
def _src_tile(src_ptr, cols2, D):
    # src[D] in x's register layout ([BLOCK_R, BLOCK_D], every row the same: no layout
    # conversion); past D: j itself
    cmask2 = cols2 < D
    return tl.where(cmask2, tl.load(src_ptr + cols2, mask=cmask2, other=0), cols2)


@triton.jit
def _kept_runs(src2, cols2, PAIR: tl.constexpr, KEPT_RUN: tl.constexpr):
    # PAIRS_KEPT: pairs stay pairs, src in KEPT_RUN-element runs from multiples of KEPT_RUN (2:
    # pairs from even columns; the host's src is built from each run's first column), which the
    # compiler is told on an op of this branch (the same values where the run holds) so that the
    # partner's loads are one per run (runs of 2: 4 B in bf16, 8 B in fp32; the launch's widest, 16 B)
    if PAIR == PAIRS_KEPT:
        src2 = tl.max_contiguous(tl.multiple_of((src2 & -KEPT_RUN) | (cols2 & (KEPT_RUN - 1)), [1, KEPT_RUN]),
                                 [1, KEPT_RUN])
    return src2


@triton.jit
def _k_partner(ag_off, xrow_a, xrow_b, src_ptr, cols2, D, PAIR: tl.constexpr, KEPT_RUN: tl.constexpr,
               SRC_AGAIN: tl.constexpr):
    # k's partner offsets, formed past q's heads: from q's (src's tile is not held through q's
    # loop, though LLVM may fold (xrow_a + src) + (xrow_b - xrow_a) back to xrow_b + src and hold
    # src after all), or with SRC_AGAIN from src read again here (read at the program's start: L1
    # or L2 hits, once a program; rome.launch.src_again)
    if SRC_AGAIN:
        bg_off = xrow_b + _kept_runs(_src_tile(src_ptr, cols2, D), cols2, PAIR, KEPT_RUN)
    else:
        bg_off = ag_off + (xrow_b - xrow_a)
    return bg_off


@triton.jit
def _gather_body(a_x, a_o, ax_off, ao_off, a_sxh0, a_sxh1, a_soh0, a_soh1, a_H, a_H1,
                 b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0, b_sxh1, b_soh0, b_soh1, b_H1,
                 h_lo, h_hi, xrow_a, t0, t1, cols, cols2, src2, sign2, c, s, w, x0, x1, x2, x3, tables,
                 s_ptr, sst0, sst1, stride_ps, sp, s_ok, mask, a_nw, a_nb, b_nw, b_nb, src_ptr, eps, D,
                 a_xn, a_dw, b_xn, b_dw,
                 PAIR: tl.constexpr, SIN_AT_SRC: tl.constexpr, POSITIONS: tl.constexpr,
                 DOT: tl.constexpr, SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr, FP32_DOT: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, RAW_X: tl.constexpr, RAW_S: tl.constexpr,
                 F64: tl.constexpr, NORM: tl.constexpr, NATIVE: tl.constexpr, NORM_GRAD: tl.constexpr,
                 DEPTH: tl.constexpr, APART: tl.constexpr, LATE_TABLES: tl.constexpr, ANGLES: tl.constexpr,
                 TRANSPOSE: tl.constexpr, I64: tl.constexpr, RAW_C: tl.constexpr, KEPT_RUN: tl.constexpr,
                 AXES: tl.constexpr, FIRST: tl.constexpr, AXIS_RUN: tl.constexpr, SRC_AGAIN: tl.constexpr):
    # the program's work for one way of reading the partner (PAIR): sin at src (SIN_AT_SRC: the
    # transpose's, read here where PAIR makes it cheap), the sign folded into sin, q's heads
    # (their first loads already issued), then k's (APART: the program has one tensor's heads,
    # in q's places; k's dw rows written as zeros)
    # AXES's transpose reading sin at src (at src2; interleave's, with runs, at the columns and
    # swapped): its range folded into the sign below. The tables' class: this branch's where
    # LATE_TABLES, else PAIRS_NONE's at the kernel's top (which passes the same rule)
    SIN_SRC_FOLD: tl.constexpr = AXES > 0 and TRANSPOSE and not ANGLES and \
        (not LATE_TABLES or PAIR != PAIRS_SWAPPED or AXIS_RUN == 1)
    src2 = _kept_runs(src2, cols2, PAIR, KEPT_RUN)
    ag_off = xrow_a + src2
    pre = x0
    if DOT or FIRST:  # (the first batch's x issued by the kernel)
        pre = (x1, x2, x3)
    if APART:  # the first batch's partners (and the norm backward's xn) issued, then the tables read
        K: tl.constexpr = 1 if PAIR == PAIRS_NONE and not DOT else DEPTH
        XN: tl.constexpr = NORM_GRAD == NORM_RMS or NORM_GRAD == NORM_LAYER
        pre = _first_batch(a_x, a_xn, ax_off, ag_off, a_sxh0, a_sxh1, a_H1, tl.minimum(h_lo, a_H),
                           tl.minimum(h_hi, a_H), mask, x0, x1, x2, x3, 3, PAIR, DOT, RAW_X, K, DEPTH, XN)
    if LATE_TABLES:
        (c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc, stride_ps, n_pos,
         axis_ptr, stride_ax, row_ok, cmask, pos) = tables
        c, s, sp, s_ok = _row_tables(c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc,
                                     stride_ps, n_pos, axis_ptr, stride_ax, src_ptr, src2, t0, t1, row_ok, mask, cols,
                                     cmask, D, PAIR, POSITIONS, ANGLES, TRANSPOSE, SIN_AT_SRC, I64, RAW_C, RAW_S, F64,
                                     BLOCK_R, BLOCK_D, AXES, pos, POSITIONS == 1 or AXES > 0, AXIS_RUN,
                                     min(AXIS_RUN, KEPT_RUN) if PAIR == PAIRS_KEPT else 1, SIN_SRC_FOLD)
    if SIN_SRC_FOLD:  # NaN where sin at src's position is out of range, folded into the sign, from
        # the positions alone, before the rows are in
        sign2 = sign2 * tl.where(s_ok, 1.0, float("nan"))
    s = _signed_sin(s, s_ptr, t0, t1, sst0, sst1, stride_ps, sp, s_ok, cols2, src2, sign2, mask, PAIR, SIN_AT_SRC,
                    POSITIONS, not DOT, BLOCK_R, BLOCK_D, RAW_S)
    xrow_b = (t0 * b_sxt0 + t1 * b_sxt1)[:, None]
    if NORM_GRAD == NORM_RMS_HEADS:  # (the backward of the norm over heads: its own two sweeps)
        _heads_norm_grad(a_x, a_o, a_xn, a_dw, ax_off, ag_off, ao_off, a_sxh0, a_sxh1, a_soh0, a_soh1, a_H1,
                         tl.minimum(h_lo, a_H), tl.minimum(h_hi, a_H), mask, c, s, a_nw, eps, D, PAIR, BLOCK_R,
                         BLOCK_D, RAW_X, F64)
        _heads_norm_grad(b_x, b_o, b_xn, b_dw, xrow_b + cols[None, :],
                         _k_partner(ag_off, xrow_a, xrow_b, src_ptr, cols2, D, PAIR, KEPT_RUN, SRC_AGAIN),
                         (t0 * b_sot0 + t1 * b_sot1)[:, None] + cols[None, :], b_sxh0, b_sxh1, b_soh0, b_soh1,
                         b_H1, tl.maximum(h_lo, a_H) - a_H, h_hi - a_H, mask, c, s, b_nw, eps, D, PAIR, BLOCK_R,
                         BLOCK_D, RAW_X, F64)
        return
    _rotate_heads(a_x, a_o, ax_off, ag_off, ao_off, a_sxh0, a_sxh1, a_soh0, a_soh1, a_H1,
                  tl.minimum(h_lo, a_H), tl.minimum(h_hi, a_H), mask, c, s, w, x0, pre, a_nw, a_nb, src_ptr,
                  eps, D, a_xn, a_dw, 3 if DOT or FIRST else 1, PAIR, DOT, SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, F64, NORM,
                  NATIVE, NORM_GRAD, DEPTH, APART)
    if APART:
        if NORM_GRAD != NORM_NONE:
            cm = cols < D
            row = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * 2 * D
            tl.store(b_dw + row + cols, tl.zeros([BLOCK_D], dtype=tl.float32), mask=cm)
            tl.store(b_dw + row + D + cols, tl.zeros([BLOCK_D], dtype=tl.float32), mask=cm)
    else:
        _rotate_heads(b_x, b_o, xrow_b + cols[None, :],
                      _k_partner(ag_off, xrow_a, xrow_b, src_ptr, cols2, D, PAIR, KEPT_RUN, SRC_AGAIN),
                      (t0 * b_sot0 + t1 * b_sot1)[:, None] + cols[None, :], b_sxh0, b_sxh1, b_soh0, b_soh1, b_H1,
                      tl.maximum(h_lo, a_H) - a_H, h_hi - a_H, mask, c, s, w, x0, x0, b_nw, b_nb, src_ptr,
                      eps, D, b_xn, b_dw, 0, PAIR, DOT, SPLIT, OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, F64,
                      NORM, NATIVE, NORM_GRAD, DEPTH, False)


@triton.jit(do_not_specialize=["KG"])  # (KG: 0, 1 or any count of groups, one build)
def _rome_gather_kernel(
    # the signed permutation, per output column j (int32 / fp32 [D], read once per program):
    #   y[r, j] = x[r, j] * cos[t(r), j] + x[r, src[j]] * sign[j] * sin[t(r), scol[j]]
    # with scol = j in the forward (src, sign: M's column gather) and scol = src in the
    # transpose (the backward, with Mᵀ's: ((dy*sin) @ Mᵀ)[j] = sign_t[j] * dy[src[j]] * sin[src[j]])
    src_ptr, sign_ptr,
    # DOT: the dot's matrix W ([D, D]: M forward, Mᵀ backward, by strides; in the operand dtype),
    # read once per program
    w_ptr, stride_wk, stride_wn,
    # POSITIONS == 2: axis (int [D]; any stride), the position axis each column reads
    axis_ptr, stride_ax,
    # per-row data, shared by q and k: POSITIONS == 0: the tables cos, sin with the strides of
    # their two T dims; else caches [P, D] (row strides stride_pc / stride_ps, n_pos rows) read at
    # positions p (strides of the T dims, stride_pa between axes), or with ANGLES inv_freq and the
    # column scale as fp32 hi/lo rows [2, D] (row strides stride_pc / stride_ps)
    c_ptr, s_ptr, sct0, sct1, sst0, sst1,
    p_ptr, spt0, spt1, stride_pa, stride_pc, stride_ps, n_pos,
    n_t, T1,  # T rows (those with their own tables): t = t0 * T1 + t1
    # q (a) and k (b): x and out, the strides of their two T dims and of their two head dims (the
    # rows sharing one table row: H0 * H1 = H of them, h = h0 * H1 + h1); b_H = 0 without k
    a_x, a_o, a_sxt0, a_sxt1, a_sot0, a_sot1, a_sxh0, a_sxh1, a_soh0, a_soh1, a_H, a_H1,
    b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0, b_sxh1, b_soh0, b_soh1, b_H, b_H1,
    D,  # head_dim
    # NORM: q's and k's norm weight (weight + offset) and LayerNorm bias (fp32 [D]), and eps
    a_nw, a_nb, b_nw, b_nb, eps,
    # NORM with TRANSPOSE (the norm's backward, x = dy): the forward's q and k (dy's strides) and
    # their dw/db partial sums, fp32 [programs, 2, D], one row per program (summed by the caller)
    a_xn, a_dw, b_xn, b_dw,
    HB,  # heads per program: program (i, g) rotates T rows [i*BLOCK_R, +BLOCK_R) of heads
         # [g*HB, +HB) of q's heads followed by k's (KG == 0), or
    KG,  # (KG > 0) the groups [0, KG) take HB of q's heads each, the groups from KG on HB of k's
         # (k's arguments in q's places): no program walks from q's last heads into k's, whose
         # first loads would wait for q's (a decode step's small groups; rome.launch.head_groups)
    POSITIONS: tl.constexpr,  # 0: tables per T row; 1: cache row pos[t]; 2: pos[t, axis[j]]
    ANGLES: tl.constexpr,  # with positions: cos/sin computed from them (c: inv_freq, s: scale)
    TRANSPOSE: tl.constexpr,  # backward: sin read at src (scol = src)
    DOT: tl.constexpr,  # x @ W on the tensor cores (the seed's formulation) instead of the gather
    SPLIT: tl.constexpr, OP_DTYPE: tl.constexpr,  # DOT: the operand as SPLIT pieces in OP_DTYPE
    FP32_DOT: tl.constexpr,  # DOT: fp32 operands, IEEE (the interpreter)
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,  # T rows per program, D padded to a power of two
    I64: tl.constexpr,  # 64-bit offsets inside a tile (some tensor spans 2**31 elements or more)
    RAW_X: tl.constexpr, RAW_C: tl.constexpr, RAW_S: tl.constexpr,  # interpreter: bf16 as raw bits
    F64: tl.constexpr,  # interpreter: error-free products through float64
    NORM: tl.constexpr,  # forward: x normalised per head first (NORM_RMS, NORM_LAYER): the QK-norm prologue;
    # with TRANSPOSE its backward as the epilogue (NORM_RMS, NORM_LAYER; dx from dy and the forward's x)
    NATIVE: tl.constexpr = False,  # rounding="native": the eager chain's per-op rounding (_native)
    HEADS_B: tl.constexpr = 0,  # NORM_RMS_HEADS as the token tile (_token_heads): a tensor's heads
    # as BLOCKS blocks of HEADS_B (a power of two); program (i, 0) walks q's tokens, (i, 1) k's.
    # HEADS_B 0: the head groups
    BLOCKS: tl.constexpr = 1,
    PAIRS: tl.constexpr = 0,  # the token tile: src's pair class (PAIRS_*) as the launch knows it, so
    # the build holds that class's code only (the head groups read it at src[D]: one build for all)
    DEPTH: tl.constexpr = 3,  # the head groups' gather: heads a batch (``rome.launch.gather_depth``:
    # by x's dtype, the fused norm and the GPU compiled for; PAIRS_NONE takes one; the dot:
    # launch.dot_depth, two for bf16 with its wide tile on sm_90, else one)
    SEAM: tl.constexpr = False,  # KG > 0: q's head groups and k's apart (a build of its own, so the
    # one-group launches' code keeps H1 == 1 a constant)
    OPAQUE: tl.constexpr = False,  # the token tile compiled for an NVIDIA GPU: its offsets formed
    # where used through an inline-PTX move (_opaque; not on AMD, not in the interpreter)
    FULL: tl.constexpr = False,  # the token tile: its heads fill its blocks and D == BLOCK_D (no mask)
    KEPT_RUN: tl.constexpr = 2,  # PAIRS_KEPT: src moves whole runs of KEPT_RUN columns (2, 4 or 8)
    # from multiples of it (``rome.launch.kept_run``: the launch knows it), so the partner's loads
    # are KEPT_RUN elements wide (a half rotation of the whole head in bf16: one 16-byte load per
    # 8 elements where runs of 2 took four 4-byte ones)
    AXES: tl.constexpr = 0,  # POSITIONS == 2 on 2-4 axes (rome.launch.position_axes: the forward and
    # the gather's transpose): a row's positions read once an axis, a column's picked by its axis
    # (_by_axis); 0: pos[r, axis[j]] read per element
    AXIS_RUN: tl.constexpr = 1,  # AXES: axis[j] is the same over each AXIS_RUN columns from a
    # multiple of it (1, 2 or 4), and the caches' row strides are multiples of it
    # (rome.launch.axis_run): their rows read as AXIS_RUN-wide vectors in x's layout (_run_rows)
    FIRST: tl.constexpr = False,  # the head groups' gather: its whole first batch issued before the
    # tables (rome.launch.first_batch_first; the SEAM build and the dot always issue it so)
    SRC_AGAIN: tl.constexpr = False,  # the head groups: k's partner offsets from src read again
    # past q's heads, not formed from q's (rome.launch.src_again)
    HALVES: tl.constexpr = False,  # the head groups of src's whole-head half rotation, tables or a
    # cache at one position per T row, no norm: each head as its two halves (_halves_heads;
    # rome.launch.halves_config)
    HALVES_RUN: tl.constexpr = 0,  # HALVES of a src pairing every column with another (not the whole
    # head's halves): src_ptr holds the pairs' columns acol, bcol ([D/2] each) in runs of HALVES_RUN
    # (rome.launch.halves_pairs); 0: the whole head's halves
):
    # Grid (T tiles, head groups). A program first issues the load of q's first head (it
    # depends on nothing), then reads the per-column vectors and its cos/sin tile once (a launch
    # reads the tables ~once: 8 B per table row, shared by every head of q and k in the group),
    # then walks its heads of q and then of k (``_rotate_heads``) DEPTH at a time: the next
    # batch's loads are issued before this batch's arithmetic and stores; every load of a head
    # precedes its store, so out may be x (in place).
    # The partner x[:, src] is read as the permutation allows (src[D], ``PAIRS_*``, a uniform
    # branch per program): interleave's pairs swapped in registers (no second load), pairs kept
    # as one load per run of KEPT_RUN columns (pairs: 4 B in bf16, 8 B in fp32; a whole head's
    # half rotation: 16 B), else one load per element; all in x's
    # register layout, so no shared memory and no layout conversion in the loop (triton 3.6's
    # and 3.9's). Per element: x read and y written once (4 B in bf16) and ~20 instructions
    # (error-free products and TwoSum in fp32). Bound by DRAM bandwidth when enough bytes are in
    # flight (DEPTH heads, 1-4, 2 KB each in bf16 D=128, per program; 4 programs per SM: 32 KB/SM
    # at 4, where 95% of an H200 at 800 ns wants ~47 by the model's loaded law), else by instruction
    # issue (~0.7 warp-instructions per element: the next bound on an H200).
    # DOT: W loaded once here; per head x @ W on the tensor cores in place of the gathered copy,
    # the same loop, DEPTH heads a batch (one; two for bf16 on sm_90's 64-row tile:
    # launch.dot_depth); bound by the shared-memory reads of W's slices (~40 B of L1 an element
    # at 32 rows, ~16 at 64), and with one program an SM (the 64-row tile) by its prologue: the
    # first batch's x and W are issued before the tables (ptxas moved no load above their layout
    # conversions' barriers) and the transpose's sin is moved to src, not gathered (_row_tables).
    PRO: tl.constexpr = NORM_NONE if TRANSPOSE else NORM  # the norm: prologue forward, epilogue backward
    EPI: tl.constexpr = NORM if TRANSPOSE else NORM_NONE
    if HEADS_B > 0:  # the norm over a token's heads, a tensor a program (q or k: scalar selects)
        on_b = tl.program_id(1) == 1
        x_ptr = tl.where(on_b, b_x, a_x)
        o_ptr = tl.where(on_b, b_o, a_o)
        nw_ptr = tl.where(on_b, b_nw, a_nw)
        xn_ptr = tl.where(on_b, b_xn, a_xn)
        dw_ptr = tl.where(on_b, b_dw, a_dw)
        sxt0 = tl.where(on_b, b_sxt0, a_sxt0)
        sxt1 = tl.where(on_b, b_sxt1, a_sxt1)
        sot0 = tl.where(on_b, b_sot0, a_sot0)
        sot1 = tl.where(on_b, b_sot1, a_sot1)
        sxh0 = tl.where(on_b, b_sxh0, a_sxh0)
        soh0 = tl.where(on_b, b_soh0, a_soh0)
        h = tl.where(on_b, b_H, a_H)
        if I64:
            sxh0 = sxh0.to(tl.int64)
            soh0 = soh0.to(tl.int64)
        _token_heads(c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc, stride_ps,
                     n_pos, axis_ptr, stride_ax, src_ptr, sign_ptr, n_t, T1, x_ptr, o_ptr, sxt0, sxt1, sot0, sot1,
                     sxh0, soh0, h, D, nw_ptr, eps, xn_ptr, dw_ptr, PAIRS, POSITIONS,
                     ANGLES, TRANSPOSE, HEADS_B, BLOCKS, BLOCK_D, I64, RAW_X, RAW_C, RAW_S, F64, OPAQUE, FULL)
        return
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    if SEAM or HALVES:  # (KG > 0) q's groups and k's apart: a group of k's heads takes k's arguments in
        # q's places (and q's in k's, whose heads it then has none of: its dw rows still written,
        # as zeros), so its first head's load is issued first as q's is (HALVES: KG read at run
        # time, one build whatever it is; 0: every group walks q's heads and then k's)
        on_k = pid_h >= KG
        if HALVES:
            on_k = on_k & (KG > 0)
        a_x, b_x = _swap(on_k, a_x, b_x)
        a_o, b_o = _swap(on_k, a_o, b_o)
        a_sxt0, b_sxt0 = _swap(on_k, a_sxt0, b_sxt0)
        a_sxt1, b_sxt1 = _swap(on_k, a_sxt1, b_sxt1)
        a_sot0, b_sot0 = _swap(on_k, a_sot0, b_sot0)
        a_sot1, b_sot1 = _swap(on_k, a_sot1, b_sot1)
        a_sxh0, b_sxh0 = _swap(on_k, a_sxh0, b_sxh0)
        a_sxh1, b_sxh1 = _swap(on_k, a_sxh1, b_sxh1)
        a_soh0, b_soh0 = _swap(on_k, a_soh0, b_soh0)
        a_soh1, b_soh1 = _swap(on_k, a_soh1, b_soh1)
        a_H, b_H = _swap(on_k, a_H, b_H)
        a_H1, b_H1 = _swap(on_k, a_H1, b_H1)
        a_nw, b_nw = _swap(on_k, a_nw, b_nw)
        a_nb, b_nb = _swap(on_k, a_nb, b_nb)
        a_xn, b_xn = _swap(on_k, a_xn, b_xn)
        a_dw, b_dw = _swap(on_k, a_dw, b_dw)
        h_lo = tl.where(on_k, pid_h - KG, pid_h) * HB
        h_hi = tl.minimum(h_lo + HB, a_H)
        if HALVES:
            h_hi = tl.minimum(h_lo + HB, tl.where(KG > 0, a_H, a_H + b_H))
    else:
        h_lo = pid_h * HB
        h_hi = tl.minimum(h_lo + HB, a_H + b_H)

    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    t = pid_t * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = t < n_t
    mask = row_ok[:, None] & cmask[None, :]
    t0 = t // T1
    t1 = t % T1  # (T1 == 1 is specialised to a constant: no division)
    if I64:
        t0 = t0.to(tl.int64)
        t1 = t1.to(tl.int64)

    # the positions of the SEAM build (POSITIONS == 1: a cache row, or the angles' position, a
    # row) and of AXES (a row's on each axis), used by the tables read in
    # _gather_body (LATE_TABLES): their loads issued first, as the head of the chain positions ->
    # cache rows (two round trips beside x's one). Loaded there, behind the class's branch, ptxas
    # (triton 3.9) issued a SEAM build's only once x's first batch was in: a register it reused
    # was the destination of src's load, which shared x's scoreboard (a decode step's third round
    # trip). Where the whole first batch is issued here (FIRST, the dot) and the tables were read
    # before the branch, ptxas put AXES's position arithmetic, or the cache rows' loads and what
    # waits on them, ahead of that batch (three round trips in a row): read after it, x's loads
    # are issued beside the positions'. (Not for builds issuing one head here: fp16's forwards on
    # sm_90 then spilled 8 B under triton 3.9)
    LATE_TABLES: tl.constexpr = SEAM or (AXES > 0 and (FIRST or DOT))  # (the tables read in _gather_body,
    # after the first batch's loads)
    pos = t0  # (unused elsewhere)
    if LATE_TABLES and POSITIONS == 1:
        pos = tl.load(p_ptr + (t0 * spt0 + t1 * spt1), mask=row_ok, other=0)
    if LATE_TABLES and AXES > 0:
        pos = _row_positions(p_ptr, t0 * spt0 + t1 * spt1, stride_pa, row_ok, AXES)
    # q's first head: its load issued before anything else but those positions (the next ones in
    # _rotate_heads, where the permutation's class, read below, tells how many; EARLY's, below, here)
    if I64:  # (else every offset of x and out, a head's too, fits in int32: fewer registers)
        # every head stride, q's and k's, x's and out's: a head offset h * stride is formed in the
        # strides' type (out's left int32 wrapped past 2**31 elements: those rows were never
        # written — tests/test_gpu.py::test_offsets_past_2_pow_31_elements on an H200)
        a_sxh0 = a_sxh0.to(tl.int64)
        a_sxh1 = a_sxh1.to(tl.int64)
        a_soh0 = a_soh0.to(tl.int64)
        a_soh1 = a_soh1.to(tl.int64)
        b_sxh0 = b_sxh0.to(tl.int64)
        b_sxh1 = b_sxh1.to(tl.int64)
        b_soh0 = b_soh0.to(tl.int64)
        b_soh1 = b_soh1.to(tl.int64)
    if HALVES:  # (no SEAM build: the loop's last batch not peeled)
        tl.static_assert(NORM == NORM_NONE and not NATIVE and not DOT and (POSITIONS <= 1 or HALVES_RUN > 0)
                         and not ANGLES, "HALVES: the gather of tables or caches at positions (several axes: the "
                         "pairs'), no norm, native rounding or dot")
        _halves_heads(src_ptr, sign_ptr, c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa,
                      stride_pc, stride_ps, n_pos, axis_ptr, stride_ax, t0, t1, row_ok, h_lo, h_hi,
                      a_x, a_o, a_sxt0, a_sxt1, a_sot0, a_sot1, a_sxh0, a_sxh1, a_soh0, a_soh1, a_H, a_H1,
                      b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0, b_sxh1, b_soh0, b_soh1, b_H1,
                      POSITIONS, TRANSPOSE, BLOCK_D // 2, I64, RAW_X, RAW_C, RAW_S, F64, DEPTH, HALVES_RUN, AXES,
                      AXIS_RUN)
        return
    xrow_a = (t0 * a_sxt0 + t1 * a_sxt1)[:, None]
    ax_off = xrow_a + cols[None, :]
    q_lo = tl.minimum(h_lo, a_H)
    q_hi = tl.minimum(h_hi, a_H)
    ha = q_lo // a_H1
    hb = q_lo % a_H1
    x0 = _fetch(a_x + (ha * a_sxh0 + hb * a_sxh1), ax_off, _while(mask, q_lo, q_hi), RAW_X)
    x1 = x0
    x2 = x0
    x3 = x0
    # the rest of q's first batch (DEPTH heads) issued here too where EARLY: issued after the tables
    # it waited on them (ptxas kept each load below their layout conversions' barriers): the SEAM
    # build (a program's few heads), the dot (one program an SM) and FIRST. (A permutation that
    # breaks pairs walks one head a batch: its loop reads heads 1 .. DEPTH - 1 again, L1 or L2 hits)
    EARLY: tl.constexpr = SEAM or DOT or FIRST
    if EARLY:
        if DEPTH >= 2:
            ha, hb = _next_head(ha, hb, a_H1)
            x1 = _fetch(a_x + (ha * a_sxh0 + hb * a_sxh1), ax_off, _while(mask, q_lo + 1, q_hi), RAW_X)
        if DEPTH >= 3:
            ha, hb = _next_head(ha, hb, a_H1)
            x2 = _fetch(a_x + (ha * a_sxh0 + hb * a_sxh1), ax_off, _while(mask, q_lo + 2, q_hi), RAW_X)
        if DEPTH >= 4:
            ha, hb = _next_head(ha, hb, a_H1)
            x3 = _fetch(a_x + (ha * a_sxh0 + hb * a_sxh1), ax_off, _while(mask, q_lo + 3, q_hi), RAW_X)

    # the permutation in x's register layout, and how it moves pairs (src[D])
    cols2 = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.int32) + cols[None, :]
    cmask2 = cols2 < D
    src2 = _src_tile(src_ptr, cols2, D)
    sign2 = tl.load(sign_ptr + cols2, mask=cmask2, other=0.0)
    pair = tl.load(src_ptr + D)

    if DOT:  # W once per program (a [BLOCK_D, BLOCK_D] operand: 32 KB in bf16 at D = 128), issued
        # before the tables: their layout conversions' barriers would hold its load back
        wmask = cmask[:, None] & cmask[None, :]
        w = tl.load(w_ptr + cols[:, None] * stride_wk + cols[None, :] * stride_wn, mask=wmask, other=0.0)
        if FP32_DOT:
            w = w.to(tl.float32)
        else:
            w = w.to(OP_DTYPE)
    else:
        w = sign2  # (unused)

    # cos at (t, j) and sin at (t, scol[j]), once for the program's heads; the transpose's sin at
    # src from tables or a cache by one position is read in _gather_body (SIN_AT_SRC; the dot's is
    # moved there from the columns' by _row_tables)
    SIN_AT_SRC: tl.constexpr = TRANSPOSE and not ANGLES and POSITIONS != 2 and not DOT
    tables = (c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc, stride_ps, n_pos,
              axis_ptr, stride_ax, row_ok, cmask, pos)
    # (with a program's few heads the tables are read in _gather_body after the first batch's
    # loads: the class's branch, and what waits on the tables' values before it (caches at
    # positions: their rows; triton 3.6: cos's layout conversion through shared memory, a
    # barrier), no longer hold the partners' loads back by a round trip)
    if LATE_TABLES:
        c = sign2
        s = sign2
        sp = t0
        s_ok = row_ok
    else:
        c, s, sp, s_ok = _row_tables(c_ptr, s_ptr, sct0, sct1, sst0, sst1, p_ptr, spt0, spt1, stride_pa, stride_pc,
                                     stride_ps, n_pos, axis_ptr, stride_ax, src_ptr, src2, t0, t1, row_ok, mask, cols,
                                     cmask, D, PAIRS_NONE, POSITIONS, ANGLES, TRANSPOSE, SIN_AT_SRC, I64, RAW_C, RAW_S, F64,
                                     BLOCK_R, BLOCK_D, AXES, AXIS_RUN=AXIS_RUN,
                                     SIN_SRC_FOLD=AXES > 0 and TRANSPOSE and not ANGLES)

    # q's heads of the group, then k's, for the way this permutation's partner is read
    ao_off = (t0 * a_sot0 + t1 * a_sot1)[:, None] + cols[None, :]
    if DOT:
        _gather_body(a_x, a_o, ax_off, ao_off, a_sxh0, a_sxh1, a_soh0, a_soh1,
                     a_H, a_H1, b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0,
                     b_sxh1, b_soh0, b_soh1, b_H1, h_lo, h_hi,
                     xrow_a, t0, t1, cols, cols2, src2, sign2, c, s, w, x0, x1, x2, x3, tables, s_ptr, sst0, sst1,
                     stride_ps, sp, s_ok, mask, a_nw, a_nb, b_nw, b_nb, src_ptr, eps, D, a_xn, a_dw, b_xn, b_dw, PAIRS_NONE, SIN_AT_SRC, POSITIONS, DOT, SPLIT,
                     OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, RAW_S, F64, PRO, NATIVE, EPI, DEPTH, SEAM,
                     LATE_TABLES, ANGLES, TRANSPOSE, I64, RAW_C, KEPT_RUN, AXES, FIRST, AXIS_RUN, SRC_AGAIN)
    elif pair == PAIRS_SWAPPED:
        _gather_body(a_x, a_o, ax_off, ao_off, a_sxh0, a_sxh1, a_soh0, a_soh1,
                     a_H, a_H1, b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0,
                     b_sxh1, b_soh0, b_soh1, b_H1, h_lo, h_hi,
                     xrow_a, t0, t1, cols, cols2, src2, sign2, c, s, w, x0, x1, x2, x3, tables, s_ptr, sst0, sst1,
                     stride_ps, sp, s_ok, mask, a_nw, a_nb, b_nw, b_nb, src_ptr, eps, D, a_xn, a_dw, b_xn, b_dw, PAIRS_SWAPPED, SIN_AT_SRC, POSITIONS, DOT, SPLIT,
                     OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, RAW_S, F64, PRO, NATIVE, EPI, DEPTH, SEAM,
                     LATE_TABLES, ANGLES, TRANSPOSE, I64, RAW_C, KEPT_RUN, AXES, FIRST, AXIS_RUN, SRC_AGAIN)
    elif pair == PAIRS_KEPT:
        _gather_body(a_x, a_o, ax_off, ao_off, a_sxh0, a_sxh1, a_soh0, a_soh1,
                     a_H, a_H1, b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0,
                     b_sxh1, b_soh0, b_soh1, b_H1, h_lo, h_hi,
                     xrow_a, t0, t1, cols, cols2, src2, sign2, c, s, w, x0, x1, x2, x3, tables, s_ptr, sst0, sst1,
                     stride_ps, sp, s_ok, mask, a_nw, a_nb, b_nw, b_nb, src_ptr, eps, D, a_xn, a_dw, b_xn, b_dw, PAIRS_KEPT, SIN_AT_SRC, POSITIONS, DOT, SPLIT,
                     OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, RAW_S, F64, PRO, NATIVE, EPI, DEPTH, SEAM,
                     LATE_TABLES, ANGLES, TRANSPOSE, I64, RAW_C, KEPT_RUN, AXES, FIRST, AXIS_RUN, SRC_AGAIN)
    else:
        _gather_body(a_x, a_o, ax_off, ao_off, a_sxh0, a_sxh1, a_soh0, a_soh1,
                     a_H, a_H1, b_x, b_o, b_sxt0, b_sxt1, b_sot0, b_sot1, b_sxh0,
                     b_sxh1, b_soh0, b_soh1, b_H1, h_lo, h_hi,
                     xrow_a, t0, t1, cols, cols2, src2, sign2, c, s, w, x0, x1, x2, x3, tables, s_ptr, sst0, sst1,
                     stride_ps, sp, s_ok, mask, a_nw, a_nb, b_nw, b_nb, src_ptr, eps, D, a_xn, a_dw, b_xn, b_dw, PAIRS_NONE, SIN_AT_SRC, POSITIONS, DOT, SPLIT,
                     OP_DTYPE, FP32_DOT, BLOCK_R, BLOCK_D, RAW_X, RAW_S, F64, PRO, NATIVE, EPI, DEPTH, SEAM,
                     LATE_TABLES, ANGLES, TRANSPOSE, I64, RAW_C, KEPT_RUN, AXES, FIRST, AXIS_RUN, SRC_AGAIN)


INTERPRET = isinstance(_rome_kernel, InterpretedFunction)


def _interpreter_fma_rounds_once() -> bool:
    # triton's interpreter evaluates tl.fma with one rounding where its C module has fma_fp32
    # (triton 3.9); older ones (3.6) multiply and add in fp32, rounding twice
    try:
        from triton._C.libtriton import interpreter
    except ImportError:
        return False
    return hasattr(interpreter, "fma_fp32")


# the kernels' F64 flag: error-free products and fmas through float64 under an interpreter
# whose fma rounds twice (else the fp32 fma, as on a GPU)
F64 = INTERPRET and not _interpreter_fma_rounds_once()
