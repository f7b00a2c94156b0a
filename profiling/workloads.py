"""Named RoPE workloads, and the inputs (q, k, tables, matrix) they are measured on."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

import rome
from rome.frequencies import rope_frequencies
from rome.layouts import (
    RopeLayout,
    angles_for_positions,
    cos_sin_for_positions,
    mrope_layout,
    rope_layout,
    section_layout,
)


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    batch: int
    q_heads: int
    kv_heads: int
    seq: int
    sections: tuple[int, ...]
    mode: str
    theta: float = 10000.0
    grid: tuple[int, ...] | None = None  # (t, h, w) token grid of a video latent, C order
    decode: bool = False  # one new token per sequence, each at its own position
    # varlen THD: sequences of these lengths packed into one (batch 1, seq their sum), positions
    # restarting at 0 in each (flash-attn's cu_seqlens)
    seqlens: tuple[int, ...] | None = None
    dtype: torch.dtype = torch.bfloat16
    # a model's RoPE configuration (scaled frequencies, mRoPE axes) as rome.layouts builds it, per
    # mode: its tables replace the sections' plain theta tables; M is still rotation_matrix(sections)
    layout: Callable[[str], RopeLayout] | None = None
    modes: tuple[str, ...] = rome.MODES  # the modes the precision part runs (a layout may fix one)
    # the model's RMSNorm of q and k right before RoPE: "head" (each head's D values: Flux, Qwen3)
    # or "heads" (all H·D values of a token: Wan's rms_norm_across_heads); the norm variants
    # (profiling.variants, ``normed``) run on such a workload, against norm-then-rotate in float64
    qk_norm: str | None = None
    norm_eps: float = 1e-6

    def __post_init__(self):
        if self.seqlens is not None and (self.batch != 1 or sum(self.seqlens) != self.seq):
            raise ValueError(f"a varlen workload packs its sequences into batch 1 and seq = their sum, "
                             f"got batch {self.batch}, seq {self.seq} and seqlens {list(self.seqlens)}")

    @property
    def head_dim(self) -> int:
        return sum(self.sections)

    def shape(self, heads: int) -> tuple[int, int, int, int]:
        return (self.batch, heads, self.seq, self.head_dim)

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def positions(self) -> torch.Tensor:
        """int64 positions: [S, n_axes] for a grid, [S] for 1D (per packed sequence for varlen),
        [B] (one token each) for decode."""
        if self.decode:
            return 1000 + 37 * torch.arange(self.batch)  # a batch at different decode steps
        if self.grid is not None:
            return rome.grid_positions(self.grid)[: self.seq]
        if self.seqlens is not None:
            return torch.cat([torch.arange(n) for n in self.seqlens])
        return torch.arange(self.seq)

    def cu_seqlens(self) -> torch.Tensor | None:
        """int32 ``[n + 1]`` offsets of the packed sequences (varlen), else None."""
        if self.seqlens is None:
            return None
        return torch.tensor([0, *itertools.accumulate(self.seqlens)], dtype=torch.int32)

    def rope_layout(self, mode: str | None = None) -> RopeLayout:
        """The per-column frequencies and axes the tables are built from (``rome.layouts``): the
        model's layout, or one block per section with ``theta``; rome's positions ops read it."""
        mode = mode or self.mode
        if self.layout is not None:
            return self.layout(mode)
        return section_layout(self.sections, mode=mode, theta=self.theta)


def _llama(scaling: dict) -> Callable[[str], RopeLayout]:
    """Llama-3 8B's 1D RoPE (head_dim 128, theta 5e5) with a transformers rope_parameters dict."""

    def layout(mode: str) -> RopeLayout:
        freqs = rope_frequencies(128, theta=500000.0, scaling=scaling, max_position_embeddings=131072)
        return rope_layout(freqs, mode=mode)

    return layout


def _qwen2_vl(mode: str) -> RopeLayout:
    """Qwen2-VL 7B's mRoPE: head_dim 128, theta 1e6, mrope_section [16, 24, 24] (t, h, w) over one
    global half rotation."""
    return mrope_layout(rope_frequencies(128, theta=1000000.0), [16, 24, 24])


VARLEN = (3000, 17, 512, 8192, 1024, 250, 4096, 1)  # packed sequence lengths (varlen workload)
YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 8192}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}

WORKLOADS = {
    w.name: w
    for w in [
        Workload("default", "seed 004's 3D video RoPE: 44/44/40 half of 128, a 20x36x40 latent",
                 1, 24, 24, 28800, (44, 44, 40), "half", grid=(20, 36, 40)),
        Workload("llama-1d", "Llama-3 8B prefill: 1D half RoPE, 32 q / 8 kv heads, theta 5e5",
                 1, 32, 8, 8192, (128,), "half", theta=500000.0),
        Workload("hunyuan-video", "HunyuanVideo 544x960x129f: 16/56/56 interleave, theta 256, 33x34x60",
                 1, 24, 24, 33 * 34 * 60, (16, 56, 56), "interleave", theta=256.0, grid=(33, 34, 60)),
        Workload("wan", "Wan2.1 14B 480p 81f: 44/42/42 interleave, 40 heads, 21x30x52",
                 1, 40, 40, 21 * 30 * 52, (44, 42, 42), "interleave", grid=(21, 30, 52)),
        Workload("cogvideox", "CogVideoX-5B: 16/24/24 interleave of D=64, 48 heads, 13x30x45",
                 1, 48, 48, 13 * 30 * 45, (16, 24, 24), "interleave", grid=(13, 30, 45)),
        Workload("llama-yarn-128k", "Llama-3 8B at 128k positions, YaRN x16 of 8k (attention factor "
                 "in the tables): 1D half RoPE, 32 q / 8 kv heads", 1, 32, 8, 131072, (128,), "half",
                 theta=500000.0, layout=_llama(YARN)),
        Workload("llama3-128k", "Llama-3.1 8B at 128k positions, llama3 scaling x8 of 8k: 1D half "
                 "RoPE, 32 q / 8 kv heads", 1, 32, 8, 131072, (128,), "half", theta=500000.0,
                 layout=_llama(LLAMA3)),
        Workload("qwen2-vl", "Qwen2-VL 7B mRoPE over a 16x36x64 video grid: sections 16/24/24 of "
                 "one global half rotation, 28 q / 4 kv heads", 1, 28, 4, 16 * 36 * 64, (128,), "half",
                 theta=1000000.0, grid=(16, 36, 64), layout=_qwen2_vl, modes=("half",)),
        Workload("decode", "batched decode: 64 sequences, one token each at its own position, 32/8 heads",
                 64, 32, 8, 1, (128,), "half", theta=500000.0, decode=True),
        Workload("wan-qknorm", "Wan2.1 14B 480p 81f attention with its q/k RMSNorm over all 40 heads "
                 "x 128 of a token (rms_norm_across_heads), then 44/42/42 interleave RoPE, 21x30x52",
                 1, 40, 40, 21 * 30 * 52, (44, 42, 42), "interleave", grid=(21, 30, 52), qk_norm="heads"),
        Workload("flux-qknorm", "Flux.1 at 1024x1152: q/k RMSNorm per head (24 heads x 128), then 16/56/56 "
                 "interleave RoPE over a 1x64x72 grid (4608 tokens, as 4096 image + 512 text)",
                 1, 24, 24, 64 * 72, (16, 56, 56), "interleave", grid=(1, 64, 72), qk_norm="head"),
        Workload("qwen3-qknorm", "Qwen3 8B prefill: q/k RMSNorm per head, then 1D half RoPE (theta 1e6), "
                 "32 q / 8 kv heads", 1, 32, 8, 8192, (128,), "half", theta=1000000.0, qk_norm="head"),
        Workload("varlen", "Llama-3 8B varlen THD prefill: 8 sequences of 1..8192 tokens packed "
                 "(cu_seqlens), positions restarting per sequence, 32 q / 8 kv heads",
                 1, 32, 8, sum(VARLEN), (128,), "half", theta=500000.0, seqlens=VARLEN),
    ]
}


def scaled_for_cpu(w: Workload) -> Workload:
    """The same RoPE on fewer heads and tokens, so the CPU run ends in seconds."""
    q_heads = min(w.q_heads, 4)
    kv_heads = max(1, w.kv_heads * q_heads // w.q_heads)
    if w.seqlens is not None:  # the same packing, each length scaled to a 2048-token total
        lengths = tuple(max(1, n * 2048 // w.seq) for n in w.seqlens)
        return w.replace(q_heads=q_heads, kv_heads=kv_heads, seq=sum(lengths), seqlens=lengths)
    return w.replace(batch=min(w.batch, 8), q_heads=q_heads, kv_heads=kv_heads, seq=min(w.seq, 2048))


def norm_weights(w: Workload, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The q and k norm weights of a ``qk_norm`` workload, fp32 (``[D]`` per head, ``[H·D]`` over
    heads), drawn around 1 from a fixed seed."""
    gen = torch.Generator().manual_seed(29)
    n = (lambda h: w.head_dim) if w.qk_norm == "head" else (lambda h: h * w.head_dim)
    return tuple(torch.rand(n(h), generator=gen).add(0.5).to(device) for h in (w.q_heads, w.kv_heads))


def norm64(x: torch.Tensor, weight: torch.Tensor, over: str, eps: float) -> torch.Tensor:
    """RMSNorm of BNSD ``x`` in float64 (per head, or over a token's heads, weight head-major):
    the norm half of the norm variants' oracle."""
    x = x.double()
    dims = (-1,) if over == "head" else (1, -1)
    y = x / torch.sqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y * weight.double().view(-1 if over == "head" else x.shape[1], *(() if over == "head" else (1, x.shape[-1])))


@dataclass
class Tables:
    cos: torch.Tensor  # broadcasts to BNSD q: [S, D], or [B, 1, 1, D] for decode
    sin: torch.Tensor
    angles: torch.Tensor  # float64, same shape: the exact tables are cos/sin of these (times the
    # layout's attention scaling where it has one)
    positions: torch.Tensor  # int64, the tokens' positions the tables are at (Workload.positions)


def tables(w: Workload, *, mode: str | None = None, dtype=torch.float32, device=None, tokens=None) -> Tables:
    """Tables of ``w`` (optionally in the other mode, or for a subset of token indices)."""
    mode = mode or w.mode
    pos = w.positions()
    if tokens is not None and not w.decode:
        pos = pos[tokens]
    pos = pos.to(device)
    layout = w.rope_layout(mode)  # float64 angles rounded once (scaled / mRoPE where the model's)
    angles = angles_for_positions(layout, pos)
    cos, sin = cos_sin_for_positions(layout, pos, dtype=dtype)
    if w.decode:
        angles, cos, sin = (t[:, None, None, :] for t in (angles, cos, sin))
    return Tables(cos, sin, angles, pos)


def qk(w: Workload, *, dtype=None, device=None, seed=0, seq=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random BNSD q and k of the workload's shape (``seq`` tokens if given)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dtype = dtype or w.dtype
    s = w.seq if seq is None else seq
    q = torch.randn(w.batch, w.q_heads, s, w.head_dim, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(w.batch, w.kv_heads, s, w.head_dim, generator=g).to(device=device, dtype=dtype)
    return q, k
