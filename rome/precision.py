"""Error metrics against a float64 oracle, shared by the tests and the precision report.

The stated tolerance for a result computed in fp32 and rounded once to ``dtype``:

    |out - exact| <= ulp_dtype(exact) + 4 * 2**-24 * (|x*cos| + |rotate(x)*sin|)

one unit in the last place of the output dtype, plus what fp32 arithmetic loses where the two
terms cancel (near such zeros no fp32 computation can be within an ulp of a tiny result).
"""

from __future__ import annotations

import torch

SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24, torch.float64: 53}
_MATH_EPS = {torch.float64: 2.0**-53}  # unit roundoff of the compute dtype; fp32 otherwise


def ulp(expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 spacing of ``dtype``'s numbers at |expected| (the subnormal spacing near 0)."""
    fi = torch.finfo(dtype)
    e = expected.double().abs()
    _, exponent = torch.frexp(e)  # e = m * 2**exponent, m in [0.5, 1)
    spacing = torch.ldexp(torch.ones_like(e), exponent - SIGNIFICAND_BITS[dtype])
    tiny = fi.smallest_normal * fi.eps
    return torch.where(e == 0, torch.full_like(e, tiny), spacing.clamp(min=tiny))


def ulp_error(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|actual - expected| in units of ``dtype``'s ulp at ``expected``."""
    return (actual.double() - expected.double()).abs() / ulp(expected, dtype)


def tolerance(expected, magnitude, dtype: torch.dtype) -> torch.Tensor:
    """The stated per-element bound (module docstring) for output ``dtype``."""
    eps = _MATH_EPS.get(dtype, 2.0**-24)
    return ulp(expected, dtype) + 4 * eps * magnitude.double()


def seed_metric(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """Seed 004's metric: max of min(abs, rel) error, and the count of elements where it is > 0.

    As the seed wrote it, it compares |actual| with |expected|, so it is blind to sign flips;
    ``max_abs`` and the ulp error are not.
    """
    a, e = actual.double(), expected.double()
    abs_error = (a.abs() - e.abs()).abs()
    rel_error = abs_error / (torch.maximum(a.abs(), e.abs()) + 1e-8)
    m = torch.minimum(abs_error, rel_error)
    return (m.max().item() if m.numel() else 0.0), int((m > 0).sum())


def error_stats(actual, expected, magnitude, dtype: torch.dtype) -> dict:
    """Every precision field the report and the tests use, for one output against the oracle."""
    a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    ulps = ulp_error(a, e, dtype)
    rel = diff / e.abs().clamp(min=torch.finfo(dtype).smallest_normal)
    seed, seed_count = seed_metric(a, e)
    empty = diff.numel() == 0
    return {
        "max_abs": 0.0 if empty else diff.max().item(),
        "max_rel": 0.0 if empty else rel.max().item(),
        "seed_metric": seed,
        "seed_count": seed_count,
        "max_ulp": 0.0 if empty else ulps.max().item(),
        "ok": bool((diff <= tolerance(e, magnitude, dtype)).all()),
    }
