"""Standalone 'section halves' kernel: each head as A = x[:, acol], B = x[:, bcol] (bcol = src[acol]),
K heads a batch, q's loop then k's (experiment, issue 27)."""
import sys

def gen(K, path):
    L = []
    w = L.append
    w("import triton\nimport triton.language as tl\nfrom rome.kernel import _dot2_short\n\n")
    w("@triton.jit\n")
    w("def _load2(x_ptr, hoff, xa, xb, m, ok):\n")
    w("    mm = m & ok\n")
    w("    return tl.load(x_ptr + hoff + xa, mask=mm, other=0.0), tl.load(x_ptr + hoff + xb, mask=mm, other=0.0)\n\n")
    w("@triton.jit\n")
    w("def _rot(o_ptr, hoff, oa, ob, m, ok, a, b, cA, cB, sA, sB):\n")
    w("    A = a.to(tl.float32)\n    B = b.to(tl.float32)\n")
    w("    oA = _dot2_short(A, cA, B, sA, False)\n    oB = _dot2_short(B, cB, A, sB, False)\n")
    w("    tl.store(o_ptr + hoff + oa, oA.to(o_ptr.dtype.element_ty), mask=m & ok)\n")
    w("    tl.store(o_ptr + hoff + ob, oB.to(o_ptr.dtype.element_ty), mask=m & ok)\n\n")
    w("@triton.jit\n")
    w("def _loop(x_ptr, o_ptr, xa, xb, oa, ob, sxh, soh, H, m, cA, cB, sA, sB, K: tl.constexpr):\n")
    for i in range(K):
        w(f"    a{i}, b{i} = _load2(x_ptr, {i} * sxh, xa, xb, m, {i} < H)\n")
    w(f"    for h in range(0, H, {K}):\n")
    for i in range(K):
        w(f"        n{i}, p{i} = _load2(x_ptr, (h + {K + i}) * sxh, xa, xb, m, h + {K + i} < H)\n")
    for i in range(K):
        w(f"        _rot(o_ptr, (h + {i}) * soh, oa, ob, m, h + {i} < H, a{i}, b{i}, cA, cB, sA, sB)\n")
    for i in range(K):
        w(f"        a{i} = n{i}\n        b{i} = p{i}\n")
    w("\n@triton.jit\n")
    w("def sec_kernel(c_ptr, s_ptr, sct, sst, n_t, acol_ptr, bcol_ptr,\n"
      "               a_x, a_o, a_sxt, a_sot, a_sxh, a_soh, a_H,\n"
      "               b_x, b_o, b_sxt, b_sot, b_sxh, b_soh, b_H, TRANSPOSE: tl.constexpr,\n"
      "               BLOCK_R: tl.constexpr, HALF: tl.constexpr, V: tl.constexpr, K: tl.constexpr):\n")
    w("    tile = tl.program_id(0)\n")
    w("    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)\n    p = tl.arange(0, HALF)\n")
    w("    ac = tl.max_contiguous(tl.multiple_of(tl.load(acol_ptr + p), V), V)[None, :]\n")
    w("    bc = tl.max_contiguous(tl.multiple_of(tl.load(bcol_ptr + p), V), V)[None, :]\n")
    w("    m = (rows < n_t)[:, None] & (p < HALF)[None, :]\n")
    w("    ra = rows[:, None] * a_sxt\n")
    w("    cA = tl.load(c_ptr + rows[:, None] * sct + ac, mask=m, other=0.0)\n")
    w("    cB = tl.load(c_ptr + rows[:, None] * sct + bc, mask=m, other=0.0)\n")
    w("    if TRANSPOSE:\n")
    w("        sA = tl.load(s_ptr + rows[:, None] * sst + bc, mask=m, other=0.0)\n")
    w("        sB = -tl.load(s_ptr + rows[:, None] * sst + ac, mask=m, other=0.0)\n")
    w("    else:\n")
    w("        sA = -tl.load(s_ptr + rows[:, None] * sst + ac, mask=m, other=0.0)\n")
    w("        sB = tl.load(s_ptr + rows[:, None] * sst + bc, mask=m, other=0.0)\n")
    w("    _loop(a_x, a_o, ra + ac, ra + bc, rows[:, None] * a_sot + ac, rows[:, None] * a_sot + bc, a_sxh, a_soh, a_H, m, cA, cB, sA, sB, K)\n")
    w("    rb = rows[:, None] * b_sxt\n")
    w("    _loop(b_x, b_o, rb + ac, rb + bc, rows[:, None] * b_sot + ac, rows[:, None] * b_sot + bc, b_sxh, b_soh, b_H, m, cA, cB, sA, sB, K)\n")
    open(path, "w").write("".join(L))

if __name__ == "__main__":
    gen(int(sys.argv[1]), sys.argv[2])
