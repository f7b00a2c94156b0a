"""rome.positions: every accepted position layout read as [B', S, A] (or [T, A] packed), offsets,
cu_seqlens, unrotated masks, and bad input."""

import itertools

import pytest
import torch

import rome.positions
from rome.positions import check_cu_seqlens, check_range, normalize_positions, token_mask


def norm(positions, a=3, b=2, s=4, **kw):
    return normalize_positions(positions, n_axes=a, batch=b, seq=s, **kw)


def test_every_layout_reads_the_same_positions():
    bsa = torch.randint(0, 50, (2, 4, 3))
    assert torch.equal(norm(bsa), bsa)
    assert torch.equal(norm(bsa.movedim(-1, 0)), bsa)  # transformers' [3, B, S]
    assert torch.equal(norm(bsa[:1].movedim(-1, 0)), bsa[:1])  # [3, 1, S] broadcasts over B
    assert torch.equal(norm(bsa[0]), bsa[:1])  # [S, A]
    text = torch.randint(0, 50, (2, 4))
    assert torch.equal(norm(text), text[..., None].expand(2, 4, 3))  # [B, S] on every axis
    assert torch.equal(norm(text[0]), text[:1, :, None].expand(1, 4, 3))  # [S]
    assert torch.equal(norm(None), torch.arange(4)[None, :, None].expand(1, 4, 3))
    one = torch.randint(0, 50, (2, 4))
    assert torch.equal(norm(one, a=1), one[..., None])
    assert torch.equal(norm(one[0, :, None], a=1), one[:1, :, None])  # [S, 1]
    assert norm(one.int(), a=1).dtype == torch.int64
    assert norm(one.float() / 2, a=1).dtype == torch.float64


def test_ambiguous_shapes_need_axes_dim():
    """[3, 3, 3] with B = S = A = 3 fits [A, B, S] and [B, S, A]: an error, not a guess (it was
    read axes first); axes_dim says which. One axis: every reading holds the same values."""
    pos = torch.randint(0, 50, (3, 3, 3))
    with pytest.raises(ValueError, match=r"ambiguous with B=3, S=3 and A=3: they read as \[A, B, S\] and as \[B, S, A\]"):
        norm(pos, b=3, s=3)
    assert torch.equal(norm(pos, b=3, s=3, axes_dim=0), pos.movedim(0, -1))
    assert torch.equal(norm(pos, b=3, s=3, axes_dim=-1), pos)
    hf = torch.randint(0, 50, (3, 2, 4))  # transformers' [A, B, S] where only that reading fits
    assert torch.equal(norm(hf), hf.movedim(0, -1))
    one = torch.randint(0, 50, (1, 1, 1))
    assert torch.equal(norm(one, a=1, b=1, s=1), one)


def test_offsets():
    pos = torch.randint(0, 50, (2, 4, 3))
    assert torch.equal(norm(pos, offsets=5), pos + 5)
    assert torch.equal(norm(pos, offsets=torch.tensor([1, 7])), pos + torch.tensor([1, 7])[:, None, None])
    assert torch.equal(norm(None, offsets=torch.tensor([1, 7])),
                       torch.arange(4)[None, :, None].expand(2, 4, 3) + torch.tensor([1, 7])[:, None, None])
    assert torch.equal(norm(pos, offsets=torch.tensor(2)), pos + 2)


def test_packed():
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    got = norm(None, a=1, s=7, cu_seqlens=cu)
    assert got.shape == (7, 1) and got[:, 0].tolist() == [0, 1, 2, 0, 1, 2, 3]
    got = norm(None, a=1, s=7, cu_seqlens=cu, offsets=torch.tensor([10, 20, 30]))
    assert got[:, 0].tolist() == [10, 11, 12, 30, 31, 32, 33]
    pos = torch.randint(0, 50, (7, 3))
    assert torch.equal(norm(pos, s=7, cu_seqlens=cu), pos)
    assert torch.equal(norm(pos.T[:, None], s=7, cu_seqlens=cu), pos)  # [3, 1, T]
    assert torch.equal(norm(pos[:, 0], s=7, cu_seqlens=cu), pos[:, :1].expand(7, 3))  # [T]


def test_check_range_and_masks():
    assert check_range(torch.tensor([[3, 9], [0, 4]])) == (0, 9)
    assert check_range(torch.zeros(0, 3, dtype=torch.int64)) is None
    assert check_range(torch.tensor([0.5, 2.25], dtype=torch.float64), 3) == (0.5, 2.25)
    assert token_mask(None, batch=2, seq=5) is None
    assert token_mask(slice(1, 3), batch=2, seq=5).tolist() == [[False, True, True, False, False]]
    assert token_mask([slice(0, 1), slice(4, None)], batch=2, seq=5).tolist() == [[True, False, False, False, True]]
    m = torch.rand(2, 5) > 0.5
    assert torch.equal(token_mask(m, batch=2, seq=5), m)
    assert torch.equal(token_mask(m[0], batch=2, seq=5), m[:1])


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: norm(torch.zeros(4, 2, dtype=torch.int64)), ValueError,
         r"positions must be \[S\], \[B=2 \(or 1\), S\], \[S, A\], \[B=2 \(or 1\), S, A\] or \[A, B=2 \(or 1\), S\] "
         r"with S=4 and A=3 \(the layout's n_axes\), got \[4, 2\]"),
        (lambda: norm(torch.zeros(3, 5, 4, dtype=torch.int64)), ValueError, r"got \[3, 5, 4\]"),
        (lambda: norm(torch.zeros(5, dtype=torch.int64)), ValueError, r"with S=4 .* got \[5\]"),
        (lambda: norm(torch.zeros(1, 2, 4, 3, dtype=torch.int64)), ValueError, r"got \[1, 2, 4, 3\]"),
        (lambda: norm(torch.zeros(2, 4, 3, dtype=torch.bool)), TypeError, r"integer or floating tensor, got torch.bool"),
        (lambda: norm([[0, 1, 2, 3]]), TypeError, r"positions must be a tensor or None, got list"),
        (lambda: norm(None, offsets=torch.tensor([1, 2, 3])), ValueError,
         r"offsets must be an int or one per sequence \(\[2\], the batch size of q\), got shape \[3\]"),
        (lambda: norm(None, offsets=torch.tensor([1.0, 2.0])), TypeError, r"offsets must be an int or an integer tensor, got torch.float32"),
        (lambda: norm(None, offsets=1.5), TypeError, r"offsets must be an int or an integer tensor, got float"),
        (lambda: norm(None, a=1, s=7, cu_seqlens=torch.tensor([0, 3, 7]), offsets=torch.tensor([1, 2, 3])), ValueError,
         r"offsets must be an int or one per sequence \(\[2\], len\(cu_seqlens\) - 1 sequences\), got shape \[3\]"),
        (lambda: check_cu_seqlens(torch.tensor([0, 4, 3, 7]), 7), ValueError,
         r"cu_seqlens must be non-decreasing, got cu_seqlens\[1\] = 4 > cu_seqlens\[2\] = 3"),
        (lambda: check_cu_seqlens(torch.tensor([1, 3, 7]), 7), ValueError, r"cu_seqlens must start at 0, got \[1, 3, 7\]"),
        (lambda: check_cu_seqlens(torch.tensor([0, 3, 6]), 7), ValueError,
         r"cu_seqlens must end at the number of packed tokens T = 7, got cu_seqlens\[-1\] = 6"),
        (lambda: check_cu_seqlens(torch.tensor([0]), 0), ValueError, r"at least 2 entries, got shape \[1\]"),
        (lambda: check_cu_seqlens(torch.tensor([0.0, 7.0]), 7), TypeError, r"cu_seqlens must be an integer tensor, got torch.float32"),
        (lambda: check_cu_seqlens([0, 7], 7), TypeError, r"cu_seqlens must be an integer tensor, got list"),
        (lambda: check_range(torch.tensor([3, -2, 1])), ValueError, r"positions must be >= 0, got min -2"),
        (lambda: check_range(torch.tensor([3, 16]), 16), ValueError, r"positions must be < max_positions=16, got max 16"),
        (lambda: check_range(torch.tensor([0.0, float("nan")])), ValueError, r"positions must be finite"),
        (lambda: token_mask(torch.zeros(6, dtype=torch.bool), batch=2, seq=5), ValueError,
         r"unrotated mask must be \[S\] or \[B, S\] with S=5, B=2, got \[6\]"),
        (lambda: token_mask(torch.zeros(5), batch=2, seq=5), TypeError, r"bool tensor, got torch.float32"),
        (lambda: token_mask(slice(0, 4, 2), batch=2, seq=5), ValueError, r"unrotated slices must have step 1"),
        (lambda: token_mask((0, 3), batch=2, seq=5), TypeError, r"unrotated must be a slice, a sequence of slices or a bool tensor, got tuple"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("axes,kind", [(1, None), (1, "blocks"), (3, "blocks"), (3, "scattered")])
def test_cache_index_and_gather_rows_against_a_loop(axes, kind):
    """gather_rows(cache, positions, axis)[..., j] = cache[positions[..., axis[j]], j], element by
    element, for non-contiguous int32 positions of several leading dims, grads included: rows
    copied per run of one axis (no axis, sections) and the element gather (> RUNS runs)."""
    d, rows = 12, 9
    cache = torch.randn(rows, d, dtype=torch.float64, requires_grad=True)
    positions = torch.randint(0, rows, (2, 5, 3, axes), dtype=torch.int32).transpose(0, 1)
    axis = None if kind is None else (torch.arange(d) * axes // d if kind == "blocks" else torch.arange(d) % axes)
    index = rome.positions.cache_index(positions, axis, d)
    got = rome.positions.gather_rows(cache, positions, axis)
    assert index.shape == got.shape == (5, 2, 3, d) and index.dtype == torch.int64
    for lead in itertools.product(*map(range, positions.shape[:-1])):
        for j in range(d):
            p = int(positions[lead][0 if axis is None else int(axis[j])])
            assert index[lead][j] == p and got[lead][j] == cache[p, j]
    got.backward(torch.ones_like(got))
    counts = torch.zeros(rows, d, dtype=torch.float64)
    for lead in itertools.product(*map(range, positions.shape[:-1])):
        for j in range(d):
            counts[int(index[lead][j]), j] += 1
    assert torch.equal(cache.grad, counts)


@pytest.mark.parametrize("span", [4, 1 << 20], ids=["repeating", "distinct"])
@pytest.mark.parametrize("axes", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_angle_rows_share_equal_values_bitwise(span, axes, dtype):
    """angle_rows computes cos/sin once per distinct column and, where positions repeat, per
    distinct position (on the CPU): bitwise the per-element float64 formula, pass-through
    columns 1 and 0."""
    d = 16
    inv = torch.tensor([1.0, 0.25, 1e-3, 0.0] * 2 + [0.5, 0.7, 0.0, 3e-5] * 2, dtype=torch.float64)
    axis = torch.randint(0, axes, (d,)) if axes > 1 else None
    freqs, scales = rome.positions.angle_frequencies(inv, 0.9)
    positions = torch.randint(0, span, (3, 7, axes), dtype=torch.int32).transpose(0, 1)
    cos, sin = rome.positions.angle_rows(freqs, scales, positions, axis, dtype=dtype)
    inv64, s64 = freqs.double().sum(0), scales.double().sum(0)
    p = rome.positions.cache_index(positions, axis, d).double()
    want_c = torch.where(inv64 != 0, (p * inv64).cos() * s64, 1.0).to(dtype)
    want_s = torch.where(inv64 != 0, (p * inv64).sin() * s64, 0.0).to(dtype)
    assert cos.shape == (7, 3, d) and cos.dtype == dtype
    assert torch.equal(cos, want_c) and torch.equal(sin, want_s)
