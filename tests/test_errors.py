"""Bad input gets a clear exception naming the argument and the shapes, before any kernel runs."""

import pytest
import torch

import rome

from conftest import BACKENDS

D = 16


def good(shape=(2, 3, 5, D)):
    x = torch.randn(shape)
    cos, sin = torch.randn(5, D), torch.randn(5, D)
    return x, cos, sin, rome.rotation_matrix([8, 8], "half")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(cos=torch.randn(5, 12), sin=torch.randn(5, 12)), ValueError, r"cos/sin last dim must be D=16 .*got cos \[5, 12\]"),
        (dict(sin=torch.randn(1, 5, D)), ValueError, r"cos and sin must have the same shape, got cos \[5, 16\] and sin \[1, 5, 16\]"),
        (dict(cos=torch.randn(7, D), sin=torch.randn(7, D)), ValueError, r"cos/sin of shape \[7, 16\] must broadcast to x of shape \[2, 3, 5, 16\]"),
        (dict(cos=torch.randn(3, 2, 5, D), sin=torch.randn(3, 2, 5, D)), ValueError, r"must broadcast to x"),
        (dict(cos=torch.randn(1, 1, 1, 5, D), sin=torch.randn(1, 1, 1, 5, D)), ValueError, r"must broadcast to x"),
        (dict(matrix=torch.randn(D, D + 2)), ValueError, r"matrix must be \[D, D\] = \[16, 16\] for x of shape \[2, 3, 5, 16\], got \[16, 18\]"),
        (dict(matrix=torch.randn(D)), ValueError, r"matrix must be \[D, D\]"),
        (dict(x=torch.randint(0, 5, (2, 3, 5, D))), TypeError, r"x must be a float16/bfloat16/float32/float64 tensor, got torch.int64"),
        (dict(cos=torch.ones(5, D, dtype=torch.int32)), TypeError, r"cos must be a float16/bfloat16/float32/float64 tensor, got torch.int32"),
        (dict(matrix=torch.ones(D, D, dtype=torch.int8)), TypeError, r"matrix must be a float16"),
        (dict(sin=torch.randn(5, D, dtype=torch.float16)), TypeError, r"sin must be float32 or x's dtype torch.float32, got torch.float16"),
        (dict(x=[1.0, 2.0]), TypeError, r"x must be a torch.Tensor, got list"),
        (dict(x=torch.tensor(1.0)), ValueError, r"x must have at least one dim"),
        (dict(cos=torch.randn(5, D, device="meta"), sin=torch.randn(5, D, device="meta")), ValueError, r"one device, got x on cpu, cos on meta, sin on meta, matrix on cpu"),
        (dict(x=torch.randn(2, 3, 5, D, dtype=torch.complex64)), TypeError, r"x must be a float16"),
    ],
)
def test_bad_apply_inputs(backend, change, error, match):
    x, cos, sin, m = good()
    args = dict(x=x, cos=cos, sin=sin, matrix=m) | change
    with pytest.raises(error, match=match):
        rome.apply(args["x"], args["cos"], args["sin"], args["matrix"], backend=backend)
    if isinstance(args["x"], torch.Tensor) and args["x"].is_floating_point() or error is ValueError:
        with pytest.raises(error, match=match):  # the registered op checks the same
            torch.ops.rome.apply(args["x"], args["cos"], args["sin"], args["matrix"], backend)


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'torch', 'triton'\), got 'cuda'"):
        rome.apply(*good(), backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        torch.ops.rome.apply(*good(), "fast")


def test_triton_limits():
    x, cos, sin, m = good()
    with pytest.raises(TypeError, match="backend='triton' takes float32/float16/bfloat16 x, got float64"):
        rome.apply(x.double(), cos, sin, m.double(), backend="triton")
    big = torch.randn(2, 258)
    with pytest.raises(ValueError, match=r"head_dim D <= 256, got x \[2, 258\]"):
        rome.apply(big, torch.randn(258), torch.randn(258), rome.half_matrix(258), backend="triton")
    # auto falls back to torch for what the kernel cannot take
    assert rome.apply(big, torch.randn(258), torch.randn(258), rome.half_matrix(258)).shape == big.shape


def test_triton_on_cpu_without_interpreter(monkeypatch):
    import rome.launcher as launcher

    monkeypatch.setattr(launcher, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="backend='triton' needs CUDA tensors .*TRITON_INTERPRET=1"):
        rome.apply(*good(), backend="triton")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_apply_qk_inputs(backend):
    x, cos, sin, m = good()
    with pytest.raises(ValueError, match=r"q and k must have the same head_dim, got q \[2, 3, 5, 16\] and k \[2, 3, 5, 8\]"):
        rome.apply_qk(x, torch.randn(2, 3, 5, 8), cos, sin, m, backend=backend)
    with pytest.raises(TypeError, match="q and k must have one dtype"):
        rome.apply_qk(x, x.half(), cos, sin, m, backend=backend)
    with pytest.raises(ValueError, match=r"must broadcast to k of shape \[2, 3, 4, 16\]"):
        rome.apply_qk(x, torch.randn(2, 3, 4, D), cos, sin, m, backend=backend)
    with pytest.raises(ValueError, match="one device, got q on cpu, k on meta"):
        rome.apply_qk(x, torch.randn(2, 3, 5, D, device="meta"), cos, sin, m, backend=backend)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got NoneType"):
        rome.apply_qk(x, None, cos, sin, m, backend=backend)
