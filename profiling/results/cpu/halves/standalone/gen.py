"""Generate a standalone 'halves' gather kernel with K heads a batch (experiment, issue 27)."""
import sys

def gen(K, path):
    L = []
    w = L.append
    w("import triton\nimport triton.language as tl\nfrom rome.kernel import _dot2_short\n\n")
    w("@triton.jit\n")
    w("def _load2(x_ptr, hoff, xo, m, ok, HALF: tl.constexpr):\n")
    w("    mm = m & ok\n")
    w("    return tl.load(x_ptr + hoff + xo, mask=mm, other=0.0), tl.load(x_ptr + hoff + xo + HALF, mask=mm, other=0.0)\n\n")
    w("@triton.jit\n")
    w("def _rot(o_ptr, hoff, oo, m, ok, a, b, cA, cB, sA, sB, HALF: tl.constexpr):\n")
    w("    A = a.to(tl.float32)\n    B = b.to(tl.float32)\n")
    w("    oA = _dot2_short(A, cA, B, sA, False)\n    oB = _dot2_short(B, cB, A, sB, False)\n")
    w("    tl.store(o_ptr + hoff + oo, oA.to(o_ptr.dtype.element_ty), mask=m & ok)\n")
    w("    tl.store(o_ptr + hoff + oo + HALF, oB.to(o_ptr.dtype.element_ty), mask=m & ok)\n\n")
    w("@triton.jit\n")
    w("def halves_kernel(c_ptr, s_ptr, sct, sst, n_t, a_x, a_o, a_sxt, a_sot, a_sxh, a_soh, a_H,\n"
      "                  b_x, b_o, b_sxt, b_sot, b_sxh, b_soh, b_H, HB, KG, TRANSPOSE: tl.constexpr,\n"
      "                  BLOCK_R: tl.constexpr, HALF: tl.constexpr, FIRST: tl.constexpr):\n")
    w("    # program (tile, g): rows [tile*BLOCK_R, +BLOCK_R); group g < KG: q's heads [g*HB, +HB), else k's\n")
    w("    tile = tl.program_id(0)\n    g = tl.program_id(1)\n")
    w("    isk = g >= KG\n")
    w("    x_ptr = tl.where(isk, b_x, a_x)\n    o_ptr = tl.where(isk, b_o, a_o)\n")
    w("    sxt = tl.where(isk, b_sxt, a_sxt)\n    sot = tl.where(isk, b_sot, a_sot)\n")
    w("    sxh = tl.where(isk, b_sxh, a_sxh)\n    soh = tl.where(isk, b_soh, a_soh)\n")
    w("    H = tl.where(isk, b_H, a_H)\n    gl = tl.where(isk, g - KG, g)\n")
    w("    h_lo = gl * HB\n    h_hi = tl.minimum(h_lo + HB, H)\n")
    w("    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)\n    cols = tl.arange(0, HALF)[None, :]\n")
    w("    m = (rows < n_t)[:, None] & (cols < HALF)\n")
    w("    xo = rows[:, None] * sxt + cols\n    oo = rows[:, None] * sot + cols\n")
    # first batch
    for i in range(K):
        w(f"    a{i}, b{i} = _load2(x_ptr, (h_lo + {i}) * sxh, xo, m, h_lo + {i} < h_hi, HALF)\n")
    w("    cA = tl.load(c_ptr + rows[:, None] * sct + cols, mask=m, other=0.0)\n")
    w("    cB = tl.load(c_ptr + rows[:, None] * sct + HALF + cols, mask=m, other=0.0)\n")
    w("    if TRANSPOSE:\n")
    w("        sA = tl.load(s_ptr + rows[:, None] * sst + HALF + cols, mask=m, other=0.0)\n")
    w("        sB = -tl.load(s_ptr + rows[:, None] * sst + cols, mask=m, other=0.0)\n")
    w("    else:\n")
    w("        sA = -tl.load(s_ptr + rows[:, None] * sst + cols, mask=m, other=0.0)\n")
    w("        sB = tl.load(s_ptr + rows[:, None] * sst + HALF + cols, mask=m, other=0.0)\n")
    w(f"    for h in range(h_lo, h_hi, {K}):\n")
    for i in range(K):
        w(f"        n{i}, p{i} = _load2(x_ptr, (h + {K + i}) * sxh, xo, m, h + {K + i} < h_hi, HALF)\n")
    for i in range(K):
        w(f"        _rot(o_ptr, (h + {i}) * soh, oo, m, h + {i} < h_hi, a{i}, b{i}, cA, cB, sA, sB, HALF)\n")
    for i in range(K):
        w(f"        a{i} = n{i}\n        b{i} = p{i}\n")
    open(path, "w").write("".join(L))

if __name__ == "__main__":
    gen(int(sys.argv[1]), sys.argv[2])
