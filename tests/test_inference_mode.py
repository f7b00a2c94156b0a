"""A first call under ``torch.inference_mode()`` leaves nothing behind that breaks a later call
outside it: kept scratch and memoized matrices are ordinary tensors (an inference tensor can be
neither written outside inference mode nor saved for a backward). Each test empties the memo it
covers first, so it fails without the fix whatever ran before it."""

import pytest
import torch

import rome
from rome import torch_backend

from conftest import DEVICE


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def _reference(x, cos, sin, m):
    """The formula itself, in float64: x*cos + (x @ M)*sin."""
    xd = x.detach().double()
    return (xd * cos.double() + (xd @ m.double()) * sin.double())


@pytest.fixture
def fresh_scratch():
    torch_backend._Work._kept.__dict__.clear()
    yield
    torch_backend._Work._kept.__dict__.clear()


def test_torch_backend_scratch_kept_under_inference_mode(fresh_scratch):
    """float32 tables with float64 x go through the kept float64 scratch (float32 x is
    converted in it): its first allocation under inference_mode must serve later calls."""
    cos, sin = rome.rope_cos_sin(torch.arange(4), (8,), mode="interleave", device="cpu")
    m = rome.rotation_matrix(8, "interleave")
    x = torch.randn(4, 8)
    with torch.inference_mode():
        rome.apply(x, cos, sin, m, backend="torch")
    out = rome.apply(x, cos, sin, m, backend="torch")  # raised "Inplace update to inference tensor"
    torch.testing.assert_close(out.double(), _reference(x, cos, sin, m), rtol=1e-6, atol=1e-6)
    xg = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(rome.apply(xg, cos, sin, m, backend="torch").sum(), xg)
    # d/dx sum(x*c + (x@M)*s) = c + s @ M^T
    torch.testing.assert_close(g.double(), cos.double() + sin.double() @ m.double().T, rtol=1e-6, atol=1e-6)


# --- the memoized matrices: a first call under inference mode, then a training call ---------------

D, S = 8, 4


@pytest.fixture
def fresh_matrices():
    rome.matrices._KEPT.clear()
    torch_backend._Work._kept.__dict__.clear()
    yield
    rome.matrices._KEPT.clear()


def _angles(positions, d=D, theta=10000.0):
    """[S, d/2] float64: position * theta^(-2i/d), the standard RoPE angles."""
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return positions.double()[:, None] * inv[None, :]


def _rotate_half_ref(x, a):
    """NeoX/Llama's formula on pairs (i, i + d/2) at angles a [S, d/2] (float64)."""
    x = x.double()
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = a.cos(), a.sin()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def _rotate_interleave_ref(x, a):
    """GPT-J's formula on pairs (2i, 2i+1) at angles a [S, d/2] (float64)."""
    x = x.double()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = a.cos(), a.sin()
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)


def _train_check(run, ref, *inputs, tol=1e-5):
    """``run(*inputs)`` under inference mode first, then with gradients: its output and the
    gradient of sum(out * w) match the float64 formula ``ref`` and its autograd gradient."""
    with torch.inference_mode():
        run(*inputs)
    xs = [t.clone().requires_grad_() for t in inputs]
    outs = run(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    ws = [torch.randn_like(o) for o in outs]
    grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, ws)), xs)
    rs = [t.detach().double().requires_grad_() for t in inputs]
    refs = ref(*rs)
    refs = refs if isinstance(refs, tuple) else (refs,)
    ref_grads = torch.autograd.grad(sum((r * w.double()).sum() for r, w in zip(refs, ws)), rs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.double(), r, rtol=tol, atol=tol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, rtol=tol, atol=tol)


def test_ops_mode_shortcut(fresh_matrices):
    a = _angles(torch.arange(S))
    cos, sin = rome.rope_cos_sin(torch.arange(S), (D,), mode="half", device=DEVICE)
    _train_check(lambda x: rome.apply(x, cos, sin, mode="half", backend="torch"),
                 lambda x: _rotate_half_ref(x, a), _rand(2, S, D))


def test_hub_kernels_apply_rotary_transformers(fresh_matrices):
    from rome.integrations.hub_kernels import apply_rotary_transformers
    a = _angles(torch.arange(S))
    emb = torch.cat([a, a], -1)[None].float()  # transformers' [B, S, D] tables
    cos, sin = emb.cos(), emb.sin()
    _train_check(lambda q, k: apply_rotary_transformers(q, k, cos, sin, backend="torch"),
                 lambda q, k: (_rotate_half_ref(q, a), _rotate_half_ref(k, a)),
                 _rand(1, 2, S, D), _rand(1, 1, S, D))


def test_diffusers_rotate(fresh_matrices):
    from rome.integrations.diffusers import _Rotate
    a = _angles(torch.arange(S))
    cos = a.cos().repeat_interleave(2, -1).float()  # diffusers' real tables, interleaved pairs
    sin = a.sin().repeat_interleave(2, -1).float()
    rotate = _Rotate("torch")
    _train_check(lambda q, k: rotate(q, k, cos, sin),
                 lambda q, k: (_rotate_interleave_ref(q, a), _rotate_interleave_ref(k, a)),
                 _rand(1, 2, S, D), _rand(1, 2, S, D))


def test_module_matrix(fresh_matrices):
    rope = rome.RoPE.sections((D,), mode="half", backend="torch")
    a = _angles(torch.arange(S))
    _train_check(lambda q, k: rope(q, k), lambda q, k: (_rotate_half_ref(q, a), _rotate_half_ref(k, a)),
                 _rand(1, 2, S, D), _rand(1, 2, S, D))


def test_halfwidth_matrix_flash_attn(fresh_matrices):
    """flash-attn's adapter (half-width tables, partial rotary: the last D - 4 columns pass)."""
    from rome.integrations.flash_attn import apply_rotary_emb
    a = _angles(torch.arange(S), d=4)
    cos, sin = a.cos().float(), a.sin().float()  # flash-attn's [S, rotary_dim / 2]

    def ref(x):
        return torch.cat([_rotate_half_ref(x[..., :4], a[:, None]), x[..., 4:]], -1)

    _train_check(lambda x: apply_rotary_emb(x, cos, sin, backend="torch"), ref, _rand(1, S, 2, D))
