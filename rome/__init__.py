"""rome: rotary position embedding as a matrix, ``out = x*cos + (x @ M)*sin``.

Every RoPE variant (GPT-J interleave, NeoX/Llama half, multi-axis 2D/3D video RoPE with
per-axis sections) is that one formula with M a D×D signed permutation, computed by one fused
Triton kernel (forward and backward, q and k together), with a pure-torch backend. Distributed
as ``rome-rope`` (``pip install rome-rope``; docs/install.md), imported as ``rome``.
"""

# the package's one version: pyproject.toml reads it from here (setuptools' dynamic version)
__version__ = "0.1.0"

from . import positions, reference
from .frequencies import Frequencies, frequencies_from_hf, rope_frequencies
from .inplace import apply_, apply_out, apply_qk_, apply_qk_out, apply_qkv_, qkv_split
from .layouts import (
    RopeLayout,
    axial_layout,
    cos_sin_cache,
    mrope_layout,
    rope_layout,
    section_layout,
    tables_for_positions,
)
from .matrices import MODES, half_matrix, interleave_matrix, rotation_matrix
from .module import RoPE, registry_bytes
from .ops import BACKENDS, apply, apply_at, apply_qk, apply_qk_angles, apply_qk_at, positions_checked
from .qknorm import QKNorm, apply_qk_norm, apply_qk_norm_at
from .tables import grid_positions, rope_angles, rope_cos_sin
from .types import AngleSource, Backend, Mode, QkvLayout, Rounding

__all__ = [
    "__version__",
    "AngleSource",
    "Backend",
    "BACKENDS",
    "Frequencies",
    "MODES",
    "Mode",
    "QkvLayout",
    "RoPE",
    "RopeLayout",
    "Rounding",
    "axial_layout",
    "cos_sin_cache",
    "frequencies_from_hf",
    "mrope_layout",
    "positions",
    "registry_bytes",
    "rope_frequencies",
    "rope_layout",
    "section_layout",
    "tables_for_positions",
    "apply",
    "apply_",
    "apply_at",
    "apply_qk_angles",
    "apply_qk_at",
    "QKNorm",
    "apply_qk_norm",
    "apply_qk_norm_at",
    "positions_checked",
    "apply_out",
    "apply_qk",
    "apply_qk_",
    "apply_qk_out",
    "apply_qkv_",
    "qkv_split",
    "grid_positions",
    "half_matrix",
    "interleave_matrix",
    "reference",
    "rope_angles",
    "rope_cos_sin",
    "rotation_matrix",
]
