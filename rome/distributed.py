"""rome over torch.distributed: DTensor sharding rules for rome's ops, sequence-parallel positions.

Importing this module registers, with torch's ``register_sharding``
(``torch.distributed.tensor.experimental``), how the four ops ``rome::apply``, ``apply_qk``,
``apply_transposed`` and ``apply_qk_transposed`` (the backward of one family is the other) run
on DTensors. ``out[..., j] = x[..., j]*cos[..., j] + (x @ M)[..., j]*sin[..., j]`` reads one row
of x and the table entries broadcast to that row, so each rank computes its own shard, with no
communication, under these placements (per mesh dim):

    x (each of q, k)          cos, sin                                 matrix     out
    Replicate                 Replicate                                Replicate  Replicate
    Shard(d), d < ndim - 1    Shard(x's d, aligned from the right),    Replicate  Shard(d)
                              or Replicate where they broadcast along d
    Partial (sum)             Replicate                                Replicate  Partial

(out is linear in x, hence the Partial row). DTensor takes the rule its inputs reach most
cheaply: a replicated cos/sin is sliced locally to x's shards, which costs no communication.
q and k may be sharded differently (e.g. q on heads, k replicated) wherever the tables allow.

The last (head_dim) dim is never split: x @ M mixes the columns of a row. x, q, k, cos or sin
sharded on their last dim, or a sharded matrix, raise ValueError (redistribute that mesh dim
to ``Replicate()`` first); a Partial cos, sin or matrix is all-reduced by DTensor.

``rome.apply`` / ``apply_qk`` (and so ``rome.RoPE``) import this module the first time one of
their arguments is a DTensor, and treat plain tensors among the arguments (typically the tables
and the matrix) as replicated on the DTensors' mesh (``DTensor.from_local``, no communication;
gradients reaching them are summed over the mesh). Call ``torch.ops.rome.*`` on DTensors
directly only after ``import rome.distributed``.

Sequence parallel with plain tensors (each rank holds a slice of the tokens, as in ring
attention or before Ulysses' all-to-all): rotate each rank's tokens with their global positions,
``local_positions``. Needs torch>=2.6 built with distributed support.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

if not torch.distributed.is_available():  # pragma: no cover - torch built without distributed
    raise ImportError("rome.distributed needs torch built with distributed support")

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

try:
    from torch.distributed.tensor.experimental import register_sharding
except ImportError as e:  # pragma: no cover - torch < 2.5
    raise ImportError(f"rome.distributed needs torch>=2.6 (DTensor's register_sharding): {e}") from e

from .checks import check_arguments
from .types import Backend

__all__ = ["OPS", "local_positions", "prepare"]

# The ops are rome.ops' torch.library ops: importing rome.distributed imports the package first,
# and the package imports rome.ops (which imports this module only lazily, when a DTensor reaches
# it: rome.distributed never imports rome.ops, so the two form no import circle).
OPS = (
    torch.ops.rome.apply.default,
    torch.ops.rome.apply_transposed.default,
    torch.ops.rome.apply_qk.default,
    torch.ops.rome.apply_qk_transposed.default,
)


def _check_placements(names: Sequence[str], specs, matrix) -> None:
    """ValueError for a split head_dim: a Shard of the last dim of x/q/k/cos/sin, or of M.
    specs: DTensors or DTensorSpecs (both have placements, ndim and shape)."""
    for name, spec in zip(names, specs):
        for mesh_dim, p in enumerate(spec.placements):
            if isinstance(p, Shard) and p.dim % spec.ndim == spec.ndim - 1:
                raise ValueError(
                    f"rome: {name} is sharded on its last (head_dim) dim (placements "
                    f"{tuple(spec.placements)}, shape {list(spec.shape)}); x @ M mixes the columns "
                    f"of a row, so redistribute mesh dim {mesh_dim} to Replicate() first"
                )
    if any(isinstance(p, Shard) for p in matrix.placements):
        raise ValueError(
            f"rome: matrix must be replicated, got placements {tuple(matrix.placements)} "
            f"(redistribute it to Replicate())"
        )


def _aligned_dims(specs) -> set[int]:
    """The dims (counted from the right, -ndim..-2) that any of the specs is sharded on."""
    return {
        p.dim % spec.ndim - spec.ndim
        for spec in specs
        for p in spec.placements
        if isinstance(p, Shard) and p.dim % spec.ndim != spec.ndim - 1
    }


def _strategies(n: int):
    """The sharding function of an op on n tensors x (1: apply, 2: apply_qk).

    Only the rules the inputs can reach without communication are listed (all replicated; the
    dims some input is sharded on; Partial if some x is): the placements DTensor then weighs
    stay few on meshes of several dims, where it tries every rule on every mesh dim."""

    def rule(*args, **kwargs):
        *xs, cos, sin, matrix = args[: n + 3]
        names = ("q", "k") if n == 2 else ("x",)
        _check_placements((*names, "cos", "sin"), (*xs, cos, sin), matrix)
        dims = sorted(_aligned_dims((*xs, cos, sin)))
        partial = any(isinstance(p, Partial) for x in xs for p in x.placements)
        tail = [Replicate(), None]  # matrix, backend
        rules = []
        # tables replicated: each x replicated, Partial (out is linear in x), or sharded on a
        # dim the tables broadcast along (absent from cos, or of size 1); q and k independently
        combos = [[]]
        for x in xs:
            options = [Replicate()] + [Partial()] * partial + [
                Shard(x.ndim + e) for e in dims if x.ndim >= -e and (cos.ndim < -e or cos.shape[e] == 1)
            ]
            combos = [c + [p] for c in combos for p in options]
        rules += [(c, [*c, Replicate(), Replicate(), *tail]) for c in combos]
        # tables sharded with every x on a dim they do not broadcast along (x has it too)
        for e in dims:
            if cos.ndim >= -e and cos.shape[e] != 1 and all(x.ndim >= -e for x in xs):
                c = [Shard(x.ndim + e) for x in xs]
                rules.append((c, [*c, Shard(cos.ndim + e), Shard(cos.ndim + e), *tail]))
        return rules

    return rule


register_sharding([OPS[0], OPS[1]])(_strategies(1))
register_sharding([OPS[2], OPS[3]])(_strategies(2))


def prepare(names: Sequence[str], *tensors: Tensor, backend: Backend = "auto") -> tuple[Tensor, ...]:
    """The arguments ``(*xs, cos, sin, matrix)`` of ``rome.apply``/``apply_qk`` (names: the
    xs' names), each plain (non-DTensor) one made a DTensor replicated on the mesh of the first
    DTensor among them (``DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim)``), then
    checked as ``rome.apply`` checks plain tensors, on the global shapes. No communication:
    each rank must hold the same values in a plain argument (as tables built from the same
    positions do). Differentiable; a gradient reaching a plain argument is summed over the mesh.
    Raises ValueError for a split head_dim (see the module doc)."""
    mesh = next(t.device_mesh for t in tensors if isinstance(t, DTensor))
    placements = [Replicate()] * mesh.ndim
    tensors = tuple(
        t if isinstance(t, DTensor) else DTensor.from_local(t, mesh, placements, run_check=False)
        for t in tensors
    )
    *xs, cos, sin, matrix = tensors
    check_arguments(dict(zip(names, xs)), cos, sin, matrix, backend)
    _check_placements((*names, "cos", "sin"), tensors[:-1], matrix)
    return tensors


def local_positions(positions: Tensor, mesh: DeviceMesh, *, dim: int, mesh_dim: int = 0) -> Tensor:
    """This rank's part of ``positions`` when the tokens are sharded like DTensor's ``Shard``.

    positions: the global positions of the whole sequence (any shape, e.g. ``[S]``, ``[B, S]``,
    ``[S, A]``), the same on every rank; dim: its token dim; the tokens are split over
    ``mesh_dim`` of ``mesh`` (replicated over the other mesh dims), as ``Shard(dim)`` splits
    them: ``torch.chunk``, ``ceil(S / W)`` tokens per rank, fewer on the last ranks. Pass the
    result to ``rome.RoPE`` with the rank's q and k (``[B, N, S_local, D]``), which are then
    rotated exactly as their rows of the whole sequence are. A plain tensor; no communication.
    """
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    if isinstance(positions, DTensor):
        raise TypeError("positions must be a plain tensor of the global positions, got a DTensor")
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be a torch.distributed.DeviceMesh, got {type(mesh).__name__}")
    if positions.ndim == 0 or not -positions.ndim <= dim < positions.ndim:
        raise ValueError(f"dim={dim} is not a dim of positions of shape {list(positions.shape)}")
    if not -mesh.ndim <= mesh_dim < mesh.ndim:
        raise ValueError(f"mesh_dim={mesh_dim} is not a dim of the {mesh.ndim}-dim mesh {mesh}")
    placements = [Replicate()] * mesh.ndim
    replicated = DTensor.from_local(positions, mesh, placements, run_check=False)
    placements[mesh_dim] = Shard(dim % positions.ndim)
    return replicated.redistribute(mesh, placements).to_local()
