"""rome over torch.distributed: DTensor q/k sharded over batch, heads and sequence, and sequence
parallel with plain tensors, on 2 CPU processes (gloo), against the single-process result.

One ``mp.spawn`` of 2 ranks runs every case (``CASES``) and writes its outcome per case; each
test reads both ranks' outcome of its case. Outputs and dx are compared bitwise (every output
element is computed from its own row, on whichever rank holds it); the table and matrix grads
are sums over tokens, which a sharded run adds in another order: ``assert_close``, float32's
default tolerance (rtol 1.3e-6, atol 1e-5). The forward must run no collective (CommDebugMode).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import subprocess
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rome

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")

WORLD = 2
B, NQ, NK, S, D = 2, 4, 2, 6, 8
SECTIONS = (2, 6)  # 2 axes, D = 8


def _inputs(dtype=torch.float32, seq=S):
    """q, k BNSD (GQA), per-token tables of seq grid positions, the matrix; same on every rank."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, NQ, seq, D, generator=g).to(dtype)
    k = torch.randn(B, NK, seq, D, generator=g).to(dtype)
    pos = torch.randint(0, 50, (seq, 2), generator=g)
    cos, sin = rome.rope_cos_sin(pos, SECTIONS, mode="half")
    return q, k, cos, sin, rome.rotation_matrix(SECTIONS, "half")


# --- the cases, run on every rank ------------------------------------------------------------


def _check_equal(actual, expected, what):
    from torch.distributed.tensor import DTensor

    if isinstance(actual, DTensor):
        actual = actual.full_tensor()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    assert torch.equal(actual, expected), f"{what}: max diff {(actual - expected).abs().max()}"


def _check_close(actual, expected, what):
    from torch.distributed.tensor import DTensor

    if isinstance(actual, DTensor):
        actual = actual.full_tensor()
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}")


def _no_comms(fn):
    """fn() under CommDebugMode: its result, asserting that no collective ran."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comms:
        out = fn()
    assert comms.get_total_counts() == 0, f"collectives in the forward: {comms.get_comm_counts()}"
    return out


def _qk_case(mesh, x_dim, tables, backward, seq=S):
    """apply_qk on q, k sharded on x_dim; tables: "plain" (plain tensors), "replicated"
    (DTensors), "sharded" (DTensors sharded on the sequence), "per-batch" ([B, 1, S, D]
    DTensors sharded on the batch). mesh: 1-D, or 2-D with the rule on its last dim."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    q, k, cos, sin, m = _inputs(seq=seq)
    lead = [Shard(0)] * (mesh.ndim - 1)  # the batch over the other mesh dims (of size 1 here)
    if tables == "per-batch":
        cos, sin = cos * torch.linspace(0.5, 1, B)[:, None, None, None], sin.expand(B, 1, seq, D)
    leaves = [t.clone().requires_grad_(backward) for t in (q, k, cos, sin, m)]
    ref = rome.apply_qk(*leaves[:4], leaves[4], backend="torch")

    x_place = [*lead, Shard(x_dim)]
    dq, dk = (distribute_tensor(t, mesh, x_place).requires_grad_(backward) for t in (q, k))
    if tables == "plain":
        dcos, dsin = (t.clone().requires_grad_(backward) for t in (cos, sin))
    else:
        place = {"replicated": Replicate(), "sharded": Shard(0), "per-batch": Shard(0)}[tables]
        place = [Replicate()] * len(lead) + [place]
        dcos, dsin = (distribute_tensor(t, mesh, place).requires_grad_(backward) for t in (cos, sin))
    dm = m.clone().requires_grad_(backward)
    out = _no_comms(lambda: rome.apply_qk(dq, dk, dcos, dsin, dm, backend="torch"))
    for o, r, name in zip(out, ref, "qk"):
        assert list(o.placements) == x_place, f"{name} out placements {o.placements}"
        _check_equal(o, r, f"{name} out")
    if backward:
        g = torch.Generator().manual_seed(2)
        grads = [torch.randn(r.shape, generator=g) for r in ref]
        torch.autograd.backward(ref, grads)
        torch.autograd.backward(out, [distribute_tensor(h, mesh, o.placements) for h, o in zip(grads, out)])
        _check_equal(dq.grad, leaves[0].grad, "dq")
        _check_equal(dk.grad, leaves[1].grad, "dk")
        for t, leaf, name in zip((dcos, dsin, dm), leaves[2:], ("dcos", "dsin", "dmatrix")):
            _check_close(t.grad, leaf.grad, name)


def _case_partial(mesh):
    """A Partial (sum) x gives a Partial out: the op is linear in x; no collective."""
    from torch.distributed.tensor import DTensor, Partial

    q, _, cos, sin, m = _inputs(torch.float64)
    rank = dist.get_rank()
    # x = Σ_r x_r with x_0 = 2 q, x_1 = -q: out_r = (2 or -1) * apply(q) exactly (scaling by a
    # power of two or -1 commutes with rounding), so the reduced out is apply(q) bit for bit
    local = q * (2.0 if rank == 0 else -1.0)
    x = DTensor.from_local(local, mesh, [Partial()], run_check=False)
    out = _no_comms(lambda: rome.apply(x, cos, sin, m, backend="torch"))
    assert tuple(out.placements) == (Partial(),), out.placements
    _check_equal(out.to_local(), rome.apply(local, cos, sin, m, backend="torch"), "local out")
    _check_equal(out.full_tensor(), rome.apply(q, cos, sin, m, backend="torch"), "out")


def _case_q_heads_k_replicated(mesh):
    """q sharded on heads, k replicated (MQA-like): each stays as it is, no collective."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    q, k, cos, sin, m = _inputs()
    dq, dk = distribute_tensor(q, mesh, [Shard(1)]), distribute_tensor(k, mesh, [Replicate()])
    out = _no_comms(lambda: rome.apply_qk(dq, dk, cos, sin, m, backend="torch"))
    assert (tuple(out[0].placements), tuple(out[1].placements)) == ((Shard(1),), (Replicate(),))
    for o, r, name in zip(out, rome.apply_qk(q, k, cos, sin, m, backend="torch"), "qk"):
        _check_equal(o, r, name)


def _case_head_dim_refused(mesh):
    """A split head_dim raises ValueError naming the argument (raw op: DTensor's RuntimeError)."""
    import rome.distributed  # noqa: F401  (the raw op needs the rules registered)
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    q, k, cos, sin, m = _inputs()
    dq = distribute_tensor(q, mesh, [Shard(3)])
    with pytest.raises(ValueError, match=r"x is sharded on its last \(head_dim\) dim"):
        rome.apply(dq, cos, sin, m)
    with pytest.raises(ValueError, match=r"k is sharded on its last"):
        rome.apply_qk(q, distribute_tensor(k, mesh, [Shard(-1)]), cos, sin, m)
    with pytest.raises(ValueError, match=r"sin is sharded on its last"):
        rome.apply(q, cos, distribute_tensor(sin, mesh, [Shard(1)]), m)
    with pytest.raises(ValueError, match=r"matrix must be replicated"):
        rome.apply(q, cos, sin, distribute_tensor(m, mesh, [Shard(0)]))
    replicated = [distribute_tensor(t, mesh, [Replicate()]) for t in (cos, sin, m)]
    with pytest.raises((RuntimeError, ValueError), match=r"x is sharded on its last"):
        torch.ops.rome.apply(dq, *replicated, "torch")  # DTensor wraps the rule's error
    # the global shapes are checked as plain tensors' are
    with pytest.raises(ValueError, match=r"cos/sin of shape \[5, 8\] must broadcast to x of shape"):
        rome.apply(distribute_tensor(q, mesh, [Shard(2)]), cos[:5], sin[:5], m)


def _module_and_positions():
    rope = rome.RoPE.sections(SECTIONS, mode="half", backend="torch")
    g = torch.Generator().manual_seed(3)
    pos = torch.randint(0, 50, (B, S, 2), generator=g)  # [B, S, A], per sequence
    return rope, pos


def _case_module_dtensor(mesh):
    """rome.RoPE takes DTensor q, k sharded on the sequence with the global positions."""
    from torch.distributed.tensor import Shard, distribute_tensor

    q, k, *_ = _inputs()
    rope, pos = _module_and_positions()
    ref_q, ref_k = (t.clone().requires_grad_() for t in (q, k))
    ref = rope(ref_q, ref_k, pos)
    dq, dk = (distribute_tensor(t, mesh, [Shard(2)]).requires_grad_() for t in (q, k))
    out = _no_comms(lambda: rope(dq, dk, pos))
    for o, r, name in zip(out, ref, "qk"):
        assert tuple(o.placements) == (Shard(2),), o.placements
        _check_equal(o, r, name)
    grads = [torch.randn(r.shape) for r in ref]
    torch.autograd.backward(ref, grads)
    torch.autograd.backward(out, [distribute_tensor(h, mesh, [Shard(2)]) for h in grads])
    _check_equal(dq.grad, ref_q.grad, "dq")
    _check_equal(dk.grad, ref_k.grad, "dk")


def _case_sequence_parallel(mesh, seq=S):
    """Plain tensors: each rank holds its tokens (torch.chunk, as DTensor's Shard) and rotates
    them with local_positions: exactly its rows of the single-process result."""
    from rome.distributed import local_positions

    rope, _ = _module_and_positions()
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(B, NQ, seq, D, generator=g), torch.randn(B, NK, seq, D, generator=g)
    pos = torch.randint(0, 50, (B, seq, 2), generator=g)
    ref = rope(q, k, pos)
    rank = dist.get_rank()
    local = [t.chunk(WORLD, dim=2)[rank] for t in (q, k)]
    local_pos = _no_comms(lambda: local_positions(pos, mesh, dim=1))
    _check_equal(local_pos, pos.chunk(WORLD, dim=1)[rank], "positions")
    out = rope(*local, local_pos)
    for o, r, name in zip(out, ref, "qk"):
        _check_equal(o, r.chunk(WORLD, dim=2)[rank], name)
    # 1-D positions [S], shared by the batch
    q1, k1 = q[:1], k[:1]
    ref1 = rope(q1, k1, torch.arange(seq) + 7)
    lp = local_positions(torch.arange(seq) + 7, mesh, dim=0)
    out1 = rope(*(t.chunk(WORLD, dim=2)[rank] for t in (q1, k1)), lp)
    for o, r, name in zip(out1, ref1, "qk"):
        _check_equal(o, r.chunk(WORLD, dim=2)[rank], name + " 1d")


def _case_context_parallel(mesh):
    """torch's context_parallel shards its buffers along the sequence (head-tail load balanced):
    given the positions among them, rome.RoPE rotates each rank's tokens as the whole run does."""
    from torch.distributed.tensor.experimental import context_parallel

    rope, _ = _module_and_positions()
    seq = 8  # a multiple of 2 * WORLD, for the head-tail split
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(B, NQ, seq, D, generator=g), torch.randn(B, NK, seq, D, generator=g)
    pos = torch.randint(0, 50, (B, seq, 2), generator=g)
    ref_q, ref_k = rope(q, k, pos)
    with context_parallel(mesh, buffers=[q, k, pos, ref_q, ref_k], buffer_seq_dims=[2, 2, 1, 2, 2]):
        assert q.shape[2] == seq // WORLD
        out = _no_comms(lambda: rope(q, k, pos))
        _check_equal(out[0], ref_q, "q")
        _check_equal(out[1], ref_k, "k")


def _case_local_positions_errors(mesh):
    from rome.distributed import local_positions

    with pytest.raises(ValueError, match=r"dim=2 is not a dim of positions of shape \[2, 6\]"):
        local_positions(torch.zeros(2, 6, dtype=torch.long), mesh, dim=2)
    with pytest.raises(ValueError, match=r"mesh_dim=1"):
        local_positions(torch.zeros(6, dtype=torch.long), mesh, dim=0, mesh_dim=1)
    with pytest.raises(TypeError, match=r"mesh must be a torch.distributed.DeviceMesh"):
        local_positions(torch.zeros(6, dtype=torch.long), "cpu", dim=0)


def _case_module_dtensor_positions_refused(mesh):
    """Positions are a plain tensor (the global ones): a DTensor there is a TypeError naming it,
    not an error from inside (its host read)."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    q, k, *_ = _inputs()
    rope, pos = _module_and_positions()
    with pytest.raises(TypeError, match=r"positions must be a plain tensor .* got a DTensor: pass positions.full_tensor"):
        rope(q, k, distribute_tensor(pos, mesh, [Replicate()]))


def _case_triton(mesh):
    """The Triton kernel (interpreter on the CPU) per shard: bitwise the single-process run."""
    from torch.distributed.tensor import Shard, distribute_tensor

    q, _, cos, sin, m = _inputs()
    x = q[:1, :1, :4]
    c, s = cos[:4], sin[:4]
    ref = rome.apply(x, c, s, m, backend="triton")
    dx = distribute_tensor(x, mesh, [Shard(2)])
    out = _no_comms(lambda: rome.apply(dx, c, s, m, backend="triton"))
    assert tuple(out.placements) == (Shard(2),), out.placements
    _check_equal(out, ref, "triton out")


CASES = {
    **{
        f"qk-{name}-{tables}-{'fwd+bwd' if bwd else 'fwd'}": (
            lambda mesh, d=d, tables=tables, bwd=bwd: _qk_case(mesh, d, tables, bwd)
        )
        for name, d in (("batch", 0), ("heads", 1), ("seq", 2))
        for tables in ("plain", "replicated")
        for bwd in (False, True)
    },
    "qk-seq-sharded-tables-fwd+bwd": lambda mesh: _qk_case(mesh, 2, "sharded", True),
    "qk-batch-per-batch-tables-fwd+bwd": lambda mesh: _qk_case(mesh, 0, "per-batch", True),
    "qk-seq-uneven-fwd+bwd": lambda mesh: _qk_case(mesh, 2, "replicated", True, seq=7),
    "qk-2d-mesh-fwd+bwd": lambda mesh: _qk_case(_mesh_2d(), 2, "plain", True),
    "partial": _case_partial,
    "q-heads-k-replicated": _case_q_heads_k_replicated,
    "head-dim-refused": _case_head_dim_refused,
    "module-dtensor": _case_module_dtensor,
    "module-dtensor-positions-refused": _case_module_dtensor_positions_refused,
    "sequence-parallel": _case_sequence_parallel,
    "sequence-parallel-uneven": lambda mesh: _case_sequence_parallel(mesh, seq=7),
    "context-parallel": _case_context_parallel,
    "local-positions-errors": _case_local_positions_errors,
    "triton": _case_triton,
}


@functools.cache
def _mesh_2d():
    """A (1, WORLD) mesh: batch over "dp" (one rank), the rule's dim over "cp". Built once per
    process and kept: its sub-groups live until the final destroy_process_group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("dp", "cp"))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (CPU kernel)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,))
    results = {}
    try:
        for name, case in CASES.items():
            torch.manual_seed(0)
            try:
                case(mesh)
                results[name] = "ok"
            except Exception:
                results[name] = traceback.format_exc()
            dist.barrier()
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()
        # Leave without running C++ static destructors: under load, gloo's worker threads can
        # still be joinable at interpreter exit and abort the process ("terminate called
        # without an active exception") after every result is written and the group is gone.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(str(tmp / "init"), str(tmp)), nprocs=WORLD, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("case", list(CASES))
def test_distributed(outcomes, case):
    for rank, results in enumerate(outcomes):
        assert results.get(case) == "ok", f"rank {rank}: {results.get(case, 'not run')}"


def test_import_is_lazy():
    """import rome loads no torch.distributed.tensor, and plain calls do not import
    rome.distributed (torch's own dispatch of a custom op may load torch.distributed.tensor)."""
    code = (
        "import sys, torch, rome\n"
        "print('torch.distributed.tensor' in sys.modules)\n"
        "x = torch.randn(2, 8); cos, sin = rome.rope_cos_sin(torch.arange(2)[:, None], (8,), mode='half')\n"
        "rome.apply(x, cos, sin, rome.rotation_matrix((8,), 'half'), backend='torch')\n"
        "print('rome.distributed' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
