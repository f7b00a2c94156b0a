"""Issue 21 (hardening, round two): argument checks of the in-place / out= / angles forms and
meta-device positions (item 5), the eager path's host syncs and the cache's growth bound."""

import pytest
import torch

import rome
from rome.frequencies import rope_frequencies
from rome.layouts import rope_layout
from rome.positions import angle_frequencies

D = 8


def _args():
    x = torch.randn(2, 4, D)
    cos, sin = torch.randn(4, D), torch.randn(4, D)
    return x, cos, sin, rome.half_matrix(D)


# --- item 5: non-tensor arguments get rome's TypeError / ValueError before the dispatcher -----

def _bad_calls():
    x, cos, sin, m = _args()
    qkv = torch.randn(2, 4, 3, 2, D)
    c1, s1 = cos[:, None], sin[:, None]
    return {
        "apply_ cos list": (lambda: rome.apply_(x.clone(), cos.tolist(), sin, m), TypeError, "cos must be a torch.Tensor"),
        "apply_ x list": (lambda: rome.apply_(x.tolist(), cos, sin, m), TypeError, "x must be a torch.Tensor"),
        "apply_ int backend": (lambda: rome.apply_(x.clone(), cos, sin, m, backend=1), ValueError, "backend must be one of"),
        "apply_qk_ k list": (lambda: rome.apply_qk_(x.clone(), [1.0], cos, sin, m), TypeError, "k must be a torch.Tensor"),
        "apply_qk_ matrix list": (lambda: rome.apply_qk_(x.clone(), x.clone(), cos, sin, m.tolist()), TypeError,
                                  "matrix must be a torch.Tensor"),
        "apply_qkv_ sin list": (lambda: rome.apply_qkv_(qkv, c1, s1.tolist(), m), TypeError, "sin must be a torch.Tensor"),
        "apply_qkv_ int backend": (lambda: rome.apply_qkv_(qkv, c1, s1, m, backend=3), ValueError, "backend must be one of"),
        "apply_out out list": (lambda: rome.apply_out(x, cos, sin, m, out=[0.0]), TypeError, "out must be a torch.Tensor"),
        "apply_out int backend": (lambda: rome.apply_out(x, cos, sin, m, out=torch.empty_like(x), backend=0), ValueError,
                                  "backend must be one of"),
        "apply_qk_out k_out list": (lambda: rome.apply_qk_out(x, x, cos, sin, m, out=(torch.empty_like(x), [0])), TypeError,
                                    "k_out must be a torch.Tensor"),
        "apply_qk_out cos int": (lambda: rome.apply_qk_out(x, x, 1, sin, m, out=(torch.empty_like(x),) * 2), TypeError,
                                 "cos must be a torch.Tensor"),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_inplace_and_out_reject_non_tensors_like_apply(case):
    fn, exc, message = _bad_calls()[case]
    with pytest.raises(exc, match=message):
        fn()


def test_apply_qk_angles_names_freqs_and_scales():
    q = torch.randn(1, 2, 4, D)
    m = rome.half_matrix(D)
    pos = torch.arange(4)[:, None]
    freqs, scales = angle_frequencies(rope_layout(rope_frequencies(D)).inv_freq, 1.0)
    with pytest.raises(TypeError, match="freqs must be a torch.Tensor, got list"):
        rome.apply_qk_angles(q, q, freqs.tolist(), scales, m, pos)
    with pytest.raises(TypeError, match="scales must be a torch.Tensor, got list"):
        rome.apply_qk_angles(q, q, freqs, scales.tolist(), m, pos)
    with pytest.raises(TypeError, match="scales must be a float16/bfloat16/float32/float64 tensor"):
        rome.apply_qk_angles(q, q, freqs, scales.int(), m, pos)
    with pytest.raises(ValueError, match=r"freqs must be the float32 frequencies .* got freqs \[3, 8\]"):
        rome.apply_qk_angles(q, q, torch.zeros(3, D), scales, m, pos)
    with pytest.raises(ValueError, match="freqs on cpu, scales on meta"):
        rome.apply_qk_angles(q, q, freqs, scales.to("meta"), m, pos)


# --- item 5: positions on the meta device ------------------------------------------------------

def _meta(*ts):
    return [t.to("meta") for t in ts]


def test_meta_positions_all_meta_work():
    q = torch.randn(1, 2, 4, D)
    cos, sin = torch.randn(6, D), torch.randn(6, D)
    m = rome.half_matrix(D)
    pos = torch.arange(4)[:, None]
    mq, mcos, msin, mm, mpos = _meta(q, cos, sin, m, pos)
    for out in (rome.apply_at(mq, mcos, msin, mm, mpos),
                *rome.apply_qk_at(mq, mq, mcos, msin, mm, mpos)):
        assert out.device.type == "meta" and out.shape == q.shape
    freqs, scales = angle_frequencies(rope_layout(rope_frequencies(D)).inv_freq, 1.0)
    qo, ko = rome.apply_qk_angles(mq, mq, *_meta(freqs, scales), mm, mpos)
    assert qo.device.type == "meta" and qo.shape == q.shape
    rope = rome.RoPE(rope_layout(rope_frequencies(D)))
    qo, ko = rope(mq, mq, torch.arange(4, device="meta"))
    assert qo.device.type == "meta" and qo.shape == q.shape
    qo, ko = rope(mq, mq)
    assert qo.shape == q.shape


def test_meta_positions_with_real_q_clear_error():
    q = torch.randn(1, 2, 4, D)
    rope = rome.RoPE(rope_layout(rope_frequencies(D)))
    with pytest.raises(ValueError, match="positions on meta cannot be used with q on cpu"):
        rope(q, q, torch.arange(4, device="meta"))
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        rome.apply_qk_at(q, q, torch.randn(6, D), torch.randn(6, D), rome.half_matrix(D),
                         torch.arange(4, device="meta")[:, None])
