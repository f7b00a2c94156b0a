import pytest
import torch

import rome


# The seed 004 test's definitions, loops as written there (bf16/NPU specifics dropped).
def seed_interleave(n):
    m = torch.zeros(n, n)
    for i in range(0, n, 2):
        m[i + 0, i + 1] = 1
        m[i + 1, i + 0] = -1
    return m


def seed_half(n):
    m = torch.zeros(n, n)
    half = n // 2
    m[:half, half:] = torch.eye(half)
    m[half:, :half] = -torch.eye(half)
    return m


def seed_compose(*blocks):
    n = sum(b.size(0) for b in blocks)
    out, o = torch.zeros(n, n), 0
    for b in blocks:
        out[o : o + b.size(0), o : o + b.size(1)] = b
        o += b.size(0)
    return out


@pytest.mark.parametrize("d", [2, 4, 40, 44, 64, 128, 256])
def test_single_blocks_equal_seed(d):
    assert torch.equal(rome.interleave_matrix(d), seed_interleave(d))
    assert torch.equal(rome.half_matrix(d), seed_half(d))


@pytest.mark.parametrize("sections", [(44, 44, 40), (16, 56, 56), (64, 64), (128,), (2, 6, 4)])
@pytest.mark.parametrize("mode", ["interleave", "half"])
def test_rotation_matrix_equals_seed_compose(sections, mode):
    seed = {"interleave": seed_interleave, "half": seed_half}[mode]
    assert torch.equal(rome.rotation_matrix(sections, mode), seed_compose(*map(seed, sections)))


@pytest.mark.parametrize("mode", ["interleave", "half"])
def test_square_is_minus_identity_and_orthogonal(mode):
    m = rome.rotation_matrix((44, 44, 40), mode, dtype=torch.float64)
    eye = torch.eye(128, dtype=torch.float64)
    assert torch.equal(m @ m, -eye)
    assert torch.equal(m @ m.T, eye)


def test_matches_rotations():
    x = torch.randn(3, 5, 24)
    assert torch.equal(x @ rome.interleave_matrix(24), rome.reference.rotate_every_two(x))
    assert torch.equal(x @ rome.half_matrix(24), rome.reference.rotate_half(x))


def test_dtype_and_device():
    m = rome.rotation_matrix([4, 6], "half", dtype=torch.bfloat16, device="meta")
    assert m.dtype == torch.bfloat16 and m.device.type == "meta" and m.shape == (10, 10)
    assert rome.rotation_matrix(8, "interleave").dtype == torch.float32


@pytest.mark.parametrize("bad", [0, -2, 3, 45])
def test_bad_sizes(bad):
    for build in (rome.interleave_matrix, rome.half_matrix):
        with pytest.raises(ValueError, match="positive even"):
            build(bad)
    with pytest.raises(ValueError, match=r"sections\[1\] must be a positive even"):
        rome.rotation_matrix([4, bad], "half")


def test_bad_types_and_modes():
    with pytest.raises(TypeError, match="d must be an int"):
        rome.half_matrix(4.0)
    with pytest.raises(TypeError, match="must be an int"):
        rome.half_matrix(True)
    with pytest.raises(ValueError, match="mode must be one of"):
        rome.rotation_matrix([4], "neox")
    with pytest.raises(ValueError, match="non-empty sequence"):
        rome.rotation_matrix([], "half")
