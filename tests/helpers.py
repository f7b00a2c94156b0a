"""Inputs and checks shared by the test modules."""

import dataclasses

import torch

import rome
from rome.precision import tolerance
from rome.reference import exact

from conftest import DEVICE


def tables(sections, mode, s, *, dtype=torch.float32, scale=37, device=DEVICE):
    """Real RoPE tables for S tokens of a grid (positions spread so angles are large)."""
    n = len(sections)
    pos = torch.arange(s * n, device=device).reshape(s, n) * scale % 997
    return rome.rope_cos_sin(pos, sections, mode=mode, dtype=dtype, device=device)


def random_tables(shape, *, dtype=torch.float32, device=DEVICE):
    """Distinct random cos and sin: they catch swapped tables and wrong transposes."""
    return torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)


def assert_rope_close(actual, x, cos, sin, sections, mode):
    """actual == x*cos + rotate(x)*sin within the stated tolerance of rome.precision."""
    assert actual.dtype == x.dtype and actual.shape == x.shape
    expected, magnitude = exact(x, cos, sin, sections, mode, magnitude=True)
    bound = tolerance(expected, magnitude, x.dtype)
    err = (actual.double() - expected).abs()
    bad = err > bound
    assert not bad.any(), (
        f"{int(bad.sum())}/{err.numel()} elements out of tolerance; worst error "
        f"{err.max().item():.3g}, e.g. got {actual[bad][:4].tolist()} want {expected[bad][:4].tolist()}"
    )


def token_ids(b=2, s=12, vocab=97):
    """Token ids of a tiny language-model test, the same for every run."""
    return torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(1))


def max_rel(a, b):
    """max |a - b| / max |b| in float64."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


class RomeCalls:
    """Counts the calls a patched model makes to ``apply_qk`` / ``apply`` / ``apply_qk_norm`` (the
    layers whose q/k norms are fused) through ``module`` (the integration module's globals,
    replaced by spies): ``.n``, and per name ``.by``."""

    def __init__(self, monkeypatch, module):
        self.n = 0
        self.by = {}
        for name in ("apply_qk", "apply", "apply_qk_norm"):
            if hasattr(module, name):
                orig = getattr(module, name)

                def counted(*a, _orig=orig, _name=name, **k):
                    self.n += 1
                    self.by[_name] = self.by.get(_name, 0) + 1
                    return _orig(*a, **k)

                monkeypatch.setattr(module, name, counted)


@dataclasses.dataclass(frozen=True)
class StaticConfig:
    """A kernel configuration for ``profiling.static`` in the shape of rome.launch.KernelConfig
    (tests/test_static_tool.py, tests/test_bandwidth_model.py: known kernels compiled ahead of time)."""
    name: str
    fn: object
    signature: dict
    constexprs: dict
    divisible_by_16: tuple
    num_warps: int = 4
    num_stages: int = 3
    meta: dict = dataclasses.field(default_factory=dict)
