"""rome.RoPE's eager path reads positions on the host once per positions tensor (issue 21): every
attention layer of a step calls its RoPE with the same positions, and each host read is a device
sync. Counted here on the CPU as the tensor methods that copy values to the host."""

import gc

import pytest
import torch
from torch.overrides import TorchFunctionMode

import rome
from rome import module as rome_module
from rome.layouts import rope_layout
from rome.frequencies import rope_frequencies

HOST_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}
LAYERS = 6


class HostReads(TorchFunctionMode):
    """Counts calls that bring a tensor's values to the host (a sync on a device)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _model(layers=LAYERS, **kwargs):
    layout = rope_layout(rope_frequencies(16), mode="half")
    return [rome.RoPE(layout, backend="torch", **kwargs) for _ in range(layers)]


def _step(ropes, q, k, positions, **kwargs):
    for rope in ropes:
        q, k = rope(q, k, positions, **kwargs)
    return q, k


def _qk(b=2, s=5):
    return torch.randn(b, 3, s, 16), torch.randn(b, 2, s, 16)


def test_a_step_reads_its_positions_once():
    ropes = _model()
    q, k = _qk()
    _step(ropes, q, k, torch.arange(5).expand(2, 5) + 7)  # warm: the cache exists
    positions = torch.arange(5).expand(2, 5) + 3
    with HostReads() as reads:
        out = _step(ropes, q, k, positions)
    assert len(reads.calls) == 1, reads.calls  # one check for the LAYERS layers
    with HostReads() as reads:  # the next step, same tensor: no read at all
        again = _step(ropes, q, k, positions)
    assert reads.calls == []
    assert all(torch.equal(a, b) for a, b in zip(out, again))
    with HostReads() as reads:  # a new positions tensor: one read again
        _step(ropes, q, k, positions.clone())
    assert len(reads.calls) == 1, reads.calls


def test_the_memo_follows_the_values():
    ropes = _model(max_positions=64)
    q, k = _qk()
    positions = torch.arange(5).repeat(2, 1)
    _step(ropes, q, k, positions)
    positions[1, 4] = 64  # in place: the version counter moves, the check runs again
    with pytest.raises(ValueError, match=r"max_positions=64, got max 64"):
        _step(ropes, q, k, positions)
    positions[1, 4] = 4
    view = positions[:, :]  # a view shares the version counter
    _step(ropes, q, k, view)
    positions.view(-1)[0] = -1  # written through another view
    with pytest.raises(ValueError, match=r">= 0, got min -1"):
        _step(ropes, q, k, view)
    positions[0, 0] = 0
    # a module with a smaller bound shares the memo, and still refuses what lies past its own
    small = _model(1, max_positions=4)
    _step(ropes, q, k, positions)
    with pytest.raises(ValueError, match=r"max_positions=4, got max 4"):
        _step(small, q, k, positions)
    # offsets are part of the key (a tensor by identity and version, an int by value)
    off = torch.tensor([0, 59])
    _step(ropes, q, k, positions, offsets=off)
    off[1] = 60
    with pytest.raises(ValueError, match=r"got max 64"):
        _step(ropes, q, k, positions, offsets=off)
    _step(ropes, q, k, positions, offsets=59)
    with pytest.raises(ValueError, match=r"got max 64"):
        _step(ropes, q, k, positions, offsets=60)


def test_a_freed_tensor_is_not_remembered():
    ropes = _model(max_positions=64)
    q, k = _qk()
    for i in range(50):  # new tensors, often at a freed one's id and address: each is checked
        positions = torch.full((2, 5), 0 if i % 2 else 64)
        if i % 2:
            _step(ropes, q, k, positions)
        else:
            with pytest.raises(ValueError, match=r"got max 64"):
                _step(ropes, q, k, positions)
        del positions  # (freed here: CPython's reference count; the collector every tenth, which
        if i % 10 == 9:  # with a test process's heap took ~0.5 s a call on CI's CPUs)
            gc.collect()
    assert len(rome_module._SPANS) <= rome_module._SPANS_MAX


def test_positions_none_with_an_int_offset_reads_nothing():
    ropes = _model(max_positions=64)
    q, k = _qk()
    _step(ropes, q, k, None)
    with HostReads() as reads:
        out = _step(ropes, q, k, None, offsets=9)
    assert reads.calls == []
    assert all(torch.equal(a, b) for a, b in zip(out, _step(ropes, q, k, torch.arange(5) + 9)))
    with pytest.raises(ValueError, match=r"max_positions=64, got max 64"):
        _step(ropes, q, k, None, offsets=60)
    with pytest.raises(ValueError, match=r">= 0, got min -1"):
        _step(ropes, q, k, None, offsets=-1)


def test_inference_tensors_are_checked_every_call():
    # no version counter: an in-place write under inference_mode leaves no trace, so no memo
    ropes = _model(max_positions=64)
    q, k = _qk()
    with torch.inference_mode():
        positions = torch.arange(5).repeat(2, 1)
        _step(ropes, q, k, positions)
        positions[0, 0] = 64
        with pytest.raises(ValueError, match=r"got max 64"):
            _step(ropes, q, k, positions)
