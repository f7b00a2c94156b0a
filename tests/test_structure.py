"""rome.structure: signed (partial) permutations found once per matrix, cached safely."""

import pytest
import torch

import rome
from rome import structure
from rome.reference import rotate_index

from conftest import DEVICE, MODES, SECTIONS


def _gather(x, index, sign):
    return x[..., index] * sign.to(x.dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sections", SECTIONS.values(), ids=SECTIONS.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_rotation_matrices_are_signed_permutations(sections, mode, dtype):
    m = rome.rotation_matrix(sections, mode, dtype=dtype, device=DEVICE)
    info = structure.describe(m)
    assert info.gather and info.signed_permutation and info.bf16_exact
    index, sign = rotate_index(sections, mode)  # by column arithmetic, independent of M
    assert torch.equal(info.index.cpu(), index) and torch.equal(info.sign.cpu().double(), sign)
    x = torch.randn(3, m.shape[0], dtype=torch.float64, device=DEVICE)
    m64 = m.double()
    assert torch.equal(_gather(x, info.index, info.sign), x @ m64)
    assert torch.equal(_gather(x, info.index_t, info.sign_t), x @ m64.T)


def test_partial_rotary_zero_block_is_a_gather_not_a_permutation():
    m = torch.zeros(64, 64, device=DEVICE)
    m[:32, :32] = rome.rotation_matrix((16, 16), "interleave", device=DEVICE)  # last 32 pass through
    info = structure.describe(m)
    assert info.gather and not info.signed_permutation
    assert (info.sign[32:] == 0).all() and (info.sign_t[32:] == 0).all()
    x = torch.randn(5, 64, dtype=torch.float64, device=DEVICE)
    assert torch.equal(_gather(x, info.index, info.sign), x @ m.double())
    assert torch.equal(_gather(x, info.index_t, info.sign_t), x @ m.double().T)
    # take: the gather index with each zero column (row) reading its own position
    own = torch.arange(64, device=DEVICE)
    for take, index in ((info.take, info.index), (info.take_t, info.index_t)):
        assert torch.equal(take[:32], index[:32]) and torch.equal(take[32:], own[32:])


def test_scattered_signed_permutation():
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(48, generator=g)
    sign = torch.randint(0, 2, (48,), generator=g) * 2.0 - 1
    m = torch.zeros(48, 48)
    m[perm, torch.arange(48)] = sign  # column j reads row perm[j]
    m = m.to(DEVICE)
    info = structure.describe(m)
    assert info.gather and info.signed_permutation
    assert torch.equal(info.index.cpu(), perm) and torch.equal(info.sign.cpu(), sign)
    x = torch.randn(2, 48, dtype=torch.float64, device=DEVICE)
    assert torch.equal(_gather(x, info.index_t, info.sign_t), x @ m.double().T)
    assert torch.equal(_gather(x, info.index, info.sign), x @ m.double())


@pytest.mark.parametrize(
    "name",
    ["dense random", "a 2 in a permutation", "a 0.5", "duplicate column targets", "two in a column",
     "a NaN", "an inf"],
)
def test_not_gathers(name):
    m = rome.rotation_matrix((8, 8), "half", device=DEVICE)
    assert m[12, 8] == -1 and structure.describe(m).gather  # column 8 reads row 12
    if name == "dense random":
        m = torch.randn(16, 16, device=DEVICE)
    elif name == "duplicate column targets":  # columns 0 and 1 both read row 0
        m = torch.eye(16, device=DEVICE)
        m[1, 1], m[0, 1] = 0, 1
    elif name == "two in a column":
        m[1, 8] = 1
    else:
        m[12, 8] = {"a 2 in a permutation": 2.0, "a 0.5": 0.5, "a NaN": float("nan"), "an inf": -float("inf")}[name]
    info = structure.describe(m)
    assert not info.gather and not info.signed_permutation


def test_bf16_exact():
    m = torch.eye(8, device=DEVICE)
    assert structure.describe(m).bf16_exact
    m[0, 0] = 1 + 2**-10  # needs 11 significand bits
    info = structure.describe(m)
    assert not info.bf16_exact and not info.gather
    m[0, 0] = 3.0
    assert structure.describe(m).bf16_exact
    m[0, 0] = float("nan")
    assert structure.describe(m).bf16_exact  # NaN stays NaN in bf16
    m[0, 0] = torch.finfo(torch.float32).max  # rounds to inf in bf16
    assert not structure.describe(m).bf16_exact


def test_cached_once_per_matrix(monkeypatch):
    structure.clear_cache()
    calls = []
    analyse = structure._analyse
    monkeypatch.setattr(structure, "_analyse", lambda m: calls.append(1) or analyse(m))
    m = rome.rotation_matrix((8, 8), "half", device=DEVICE)
    first = structure.describe(m)
    assert structure.describe(m) is first and structure.cached(m) is first and len(calls) == 1
    other = rome.rotation_matrix((8, 8), "half", device=DEVICE)  # equal values, another tensor
    structure.describe(other)
    assert len(calls) == 2


def test_in_place_change_invalidates():
    m = rome.rotation_matrix((8, 8), "half", device=DEVICE)
    assert structure.describe(m).gather
    version = m._version
    m[12, 8] = 2.0  # bumps the version counter
    assert m._version != version and structure.cached(m) is None
    assert not structure.describe(m).gather
    m[12, 8] = -1.0
    assert structure.describe(m).gather


@pytest.mark.skipif(DEVICE != "cpu", reason="writes behind the version counter are seen on the CPU only")
def test_write_through_data_is_seen_on_cpu():
    m = rome.rotation_matrix((8, 8), "half")
    assert structure.describe(m).gather
    version = m._version
    m.data[12, 8] = 2.0  # what gradcheck does: no version bump
    assert m._version == version
    assert not structure.describe(m).gather


def test_cache_holds_the_tensor_and_is_bounded():
    structure.clear_cache()
    ms = [torch.eye(4, device=DEVICE) * (1 + i % 2) for i in range(structure.CACHE_SIZE + 10)]
    for m in ms:
        structure.describe(m)
    assert len(structure._cache) == structure.CACHE_SIZE
    held = {v[0].data_ptr() for v in structure._cache.values()}
    assert held == {m.data_ptr() for m in ms[10:]}  # least recently used dropped first
    # a freed matrix cannot hand its cache entry to a new tensor at the same address:
    # the entry keeps the old tensor alive, so its storage is not reused
    m = rome.rotation_matrix((8, 8), "half", device=DEVICE)
    ptr, info = m.data_ptr(), structure.describe(m)
    del m
    assert any(v[0].data_ptr() == ptr for v in structure._cache.values())  # storage still held
    n = torch.randn(8, 8, device=DEVICE).mul_(0)
    n.fill_diagonal_(2.0)
    assert n.data_ptr() != ptr and not structure.describe(n).gather and info.gather


def test_cache_does_not_hold_autograd_graphs():
    w = torch.ones(16, device=DEVICE, requires_grad=True)
    m = rome.rotation_matrix((8, 8), "half", device=DEVICE) * w  # a computed matrix
    structure.describe(m)
    held = next(v[0] for v in reversed(structure._cache.values()))
    assert held.data_ptr() == m.data_ptr() and held.grad_fn is None and not held.requires_grad


def test_inference_tensors_are_analysed_every_call():
    with torch.inference_mode():
        m = rome.rotation_matrix((8, 8), "half", device=DEVICE)
        assert structure.describe(m).gather
        assert structure.cached(m) is None
        m[12, 8] = 2.0
        assert not structure.describe(m).gather


def test_empty_and_rectangular():
    assert structure.describe(torch.zeros(0, 0, device=DEVICE)).gather
    r = torch.zeros(3, 5, device=DEVICE)
    r[0, 4] = r[2, 0] = -1
    info = structure.describe(r)
    assert info.gather and not info.signed_permutation
    x = torch.randn(2, 3, dtype=torch.float64, device=DEVICE)
    assert torch.equal(_gather(x, info.index, info.sign), x @ r.double())
    y = torch.randn(2, 5, dtype=torch.float64, device=DEVICE)
    assert torch.equal(_gather(y, info.index_t, info.sign_t), y @ r.double().T)


def test_bad_input():
    with pytest.raises(TypeError, match="matrix must be a torch.Tensor, got list"):
        structure.describe([[1.0]])
    with pytest.raises(ValueError, match=r"matrix must be 2-D, got shape \[4\]"):
        structure.describe(torch.ones(4))
    with pytest.raises(ValueError, match="meta or fake"):
        structure.describe(torch.eye(4, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.eye(4)
    with pytest.raises(ValueError, match="meta or fake"):
        structure.describe(fake)
