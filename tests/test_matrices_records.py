"""matrices/ (issue 30): the committed records hold rome's builders to every family's M, frequencies
and axes, and the command that writes them is deterministic.

- every record matches what rome's builders give for its source config now (``RoPE.from_hf_config``
  on the transformers config, the section/mRoPE/LTX layouts of the diffusers families, the seed's and
  the generic builders' calls), column by column: ``src`` and ``sign`` of M, the axis and the
  inverse frequency as ``float.hex`` (bitwise);
- every record's M is also rebuilt from its own fields with ``rome.rotation_matrix`` (one block per
  section, zero on the pass-through columns), and for a diffusers family agrees on its rotated
  columns with the one ``rotation_matrix(head_dim, mode)`` the patch applies;
- the diffusers records' frequencies and axes give the tables of the models' own rotary modules
  (18 families, within float32 rounding of their angles);
- regenerating the records and the README into a temporary folder gives the committed bytes;
- every record has a picture, a valid PNG under 60 KB (not pixel-compared).

The transformers and diffusers records need those libraries: their checks are skipped, with the
reason, where one is not installed. An unpacked sdist has no matrices/ (MANIFEST.in does not add it):
there the tests skip; in a git checkout a missing folder fails.
"""

from __future__ import annotations

import importlib.util
import struct
import zlib
from pathlib import Path

import pytest
import torch

import rome
from profiling import matrices as gen

ROOT = Path(__file__).resolve().parent.parent
MATRICES = ROOT / "matrices"
NAMES = sorted(gen.RECIPES)
MISSING = {lib for lib in ("transformers", "diffusers") if importlib.util.find_spec(lib) is None}
MAX_PNG = 60 * 1024


@pytest.fixture(autouse=True)
def _catalogue():
    """An unpacked sdist (no .git) has no matrices/: skip there (collected all the same); in a git
    checkout a missing folder fails."""
    if not MATRICES.is_dir() and not (ROOT / ".git").exists():
        pytest.skip("matrices/ is the repository's catalogue, not part of the sdist")


def _skip_without_library(name: str) -> None:
    lib = gen.RECIPES[name].library
    if lib in MISSING:
        pytest.skip(f"{name}: its source config comes from {lib}, which is not installed")


def _committed(name: str) -> str:
    path = MATRICES / f"{name}.json"
    assert path.is_file(), f"{path} missing: run `python -m profiling matrices` (make matrices) and commit"
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The command's output (records and README, no pictures) for every record whose library is
    installed, written once into a temporary folder: ``(folder, {name: record})``."""
    out = tmp_path_factory.mktemp("matrices")
    names = [n for n in gen.RECIPES if gen.RECIPES[n].library not in MISSING]  # the command's order
    records = gen.generate(out, pictures=False, names=names)
    return out, {r["name"]: r for r in records}


def test_catalogue_has_a_record_and_a_picture_per_family():
    assert MATRICES.is_dir(), "matrices/ missing: run `python -m profiling matrices`"
    records = {p.stem for p in MATRICES.glob("*.json")}
    assert records == set(NAMES), (
        f"records without a recipe: {sorted(records - set(NAMES))}; recipes without a record: "
        f"{sorted(set(NAMES) - records)} (run `python -m profiling matrices` and commit)")
    assert len(records) >= 20
    libraries = {gen.RECIPES[n].library for n in records}
    assert libraries == {"transformers", "diffusers", "seed", "builder"}
    assert (MATRICES / "README.md").is_file()


def _columns(record: dict, key: str) -> list:
    return [c[key] for c in record["columns"]]


@pytest.mark.parametrize("name", NAMES)
def test_record_is_what_the_builders_give(name, generated):
    """The committed record against rome's builders now: M's columns, the axes, the frequencies
    (float.hex, so bitwise), the blocks, head_dim and attention scaling."""
    _skip_without_library(name)
    import json

    committed = json.loads(_committed(name))
    now = generated[1][name]
    for key in ("head_dim", "mode", "blocks", "sections", "n_axes", "attention_scaling", "source"):
        assert committed[key] == now[key], f"{name}: {key} recorded {committed[key]!r}, builders give {now[key]!r}"
    for key in ("src", "sign", "axis", "inv_freq"):
        old, new = _columns(committed, key), _columns(now, key)
        moved = [j for j, (a, b) in enumerate(zip(old, new)) if a != b]
        assert len(old) == len(new) and not moved, (
            f"{name}: {key} of columns {moved[:8]} changed: recorded {[old[j] for j in moved[:8]]}, "
            f"builders give {[new[j] for j in moved[:8]]}")


def _record_matrix(record: dict) -> torch.Tensor:
    m = torch.zeros(record["head_dim"], record["head_dim"], dtype=torch.float64)
    for c in record["columns"]:
        if c["src"] is not None:
            m[c["src"], c["j"]] = c["sign"]
    return m


@pytest.mark.parametrize("name", NAMES)
def test_record_matrix_is_rotation_matrix_of_its_blocks(name):
    """From the record alone: M is ``block_diag(rotation_matrix(size, mode))`` over its blocks, zero
    on the columns that do not turn; paired columns share their frequency and axis; M @ M is -I on
    the rotated columns."""
    import json

    record = json.loads(_committed(name))
    d = record["head_dim"]
    assert [c["j"] for c in record["columns"]] == list(range(d))
    assert sum(record["sections"]) == d and record["sections"] == [s for _, s in record["blocks"]]
    expected = torch.block_diag(*(
        torch.zeros(s, s, dtype=torch.float64) if mode == "none" else rome.rotation_matrix(s, mode, dtype=torch.float64)
        for mode, s in record["blocks"]))
    inv = [None if c["inv_freq"] is None else float.fromhex(c["inv_freq"]) for c in record["columns"]]
    still = torch.tensor([f == 0.0 for f in inv])
    expected[still[:, None] | still[None, :]] = 0
    assert torch.equal(_record_matrix(record), expected)
    rotated = ~still
    assert torch.equal((expected @ expected)[rotated][:, rotated], -torch.eye(int(rotated.sum()), dtype=torch.float64))
    for c in record["columns"]:
        if c["src"] is not None:
            partner = record["columns"][c["src"]]
            assert (partner["inv_freq"], partner["axis"]) == (c["inv_freq"], c["axis"]), (name, c, partner)
    if record["library"] == "diffusers":  # the patch rotates with rotation_matrix(D, mode) (kept_rotation_matrix)
        patch = rome.rotation_matrix(d, record["mode"], dtype=torch.float64)
        assert torch.equal(patch[:, rotated], expected[:, rotated])


def test_regeneration_is_byte_identical(generated):
    """The command's records and README are the committed bytes (pictures are not compared)."""
    if MISSING:
        pytest.skip(f"the README lists every family; {', '.join(sorted(MISSING))} not installed")
    out, records = generated
    changed = [p.name for p in sorted(out.iterdir())
               if not (MATRICES / p.name).is_file() or (MATRICES / p.name).read_bytes() != p.read_bytes()]
    assert not changed, (f"`python -m profiling matrices` would change {changed}: regenerate and commit "
                         f"matrices/ with the code change")
    assert len(records) == len(NAMES)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16:29]
    (crc,) = struct.unpack(">I", data[29:33])
    assert zlib.crc32(kind + body) == crc, "IHDR CRC mismatch"
    assert data.endswith(b"IEND\xaeB`\x82"), "no IEND chunk"
    return struct.unpack(">II", body[:8])


@pytest.mark.parametrize("name", NAMES)
def test_picture_exists_and_is_a_png(name):
    path = MATRICES / f"{name}.png"
    assert path.is_file(), f"{path} missing: run `python -m profiling matrices`"
    data = path.read_bytes()
    width, height = _png_size(data)
    assert 100 < width < 2000 and 100 < height < 2000
    assert len(data) < MAX_PNG, f"{path.name}: {len(data)} bytes"
    assert f"]({name}.png)" in (MATRICES / "README.md").read_text(encoding="utf-8")


# --- the diffusers records against the models' own rotary modules --------------------------------
# Each probe runs a family's rotary module (or the pipeline's table function, CogVideoX) on a small
# grid and returns its (cos, sin) and the integer positions per axis; rome's tables of the record's
# layout at those positions must match within float32 rounding of the model's angles. This checks
# what the generator derives from the class defaults (Wan's 44/42/42 split, Cosmos's NTK thetas,
# CogView4's position scaling...) against diffusers itself.

_T = "diffusers.models.transformers."


def _module(name: str):
    return importlib.import_module(_T + name)


def _wan(module: str, cls: str):
    def probe():
        rope = getattr(_module(module), cls)(128, (1, 2, 2), 32)
        p = torch.arange(32)
        return rope.freqs_cos, rope.freqs_sin, torch.stack([p, p, p], -1)
    return probe


def _hunyuan(module: str, cls: str, dims, theta: float):
    def probe():
        n = len(dims)
        rope = getattr(_module(module), cls)(*((1, 1) if n == 3 else ((1, 1),)), list(dims), theta)
        sizes = [3, 4, 5][-n:]
        cos, sin = rope(torch.zeros(1, 4, *sizes))
        return cos, sin, rome.grid_positions(sizes)
    return probe


def _framepack():
    rope = _module("transformer_hunyuan_video_framepack").HunyuanVideoFramepackRotaryPosEmbed(1, 1, [16, 56, 56], 256.0)
    cos, sin = rope(torch.arange(3), 4, 5, torch.device("cpu"))
    return cos, sin, rome.grid_positions([3, 4, 5])


def _flux(module: str, cls: str, theta: float, dims):
    def probe():
        rope = getattr(_module(module), cls)(theta=theta, axes_dim=list(dims))
        ids = rome.grid_positions([3, 4, 5, 2][: len(dims)])
        cos, sin = rope(ids.float())
        return cos, sin, ids
    return probe


def _complex(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``e^{iθ}`` ``[S, D/2]`` as rome's interleaved tables ``[S, D]``."""
    return freqs_cis.real.repeat_interleave(2, -1), freqs_cis.imag.repeat_interleave(2, -1)


def _z_image():
    rope = _module("transformer_z_image").RopeEmbedder(theta=256.0, axes_dims=[32, 48, 48], axes_lens=[8, 8, 8])
    ids = rome.grid_positions([3, 4, 5])
    return (*_complex(rope(ids)), ids)


def _lumina2():
    rope = _module("transformer_lumina2").Lumina2RotaryPosEmbed(10000, [32, 32, 32], (8, 8, 8), 2)
    ids = rome.grid_positions([3, 4, 5])
    return (*_complex(rope._get_freqs_cis(ids[None])[0]), ids)  # ids [B, S, 3]


def _cosmos():
    rope = _module("transformer_cosmos").CosmosRotaryPosEmbed(128, max_size=(8, 16, 16), patch_size=(1, 1, 1),
                                                                rope_scale=(2.0, 1.0, 1.0))
    cos, sin = rope(torch.zeros(1, 4, 3, 4, 5))
    return cos, sin, rome.grid_positions([3, 4, 5])


def _cogview4():
    rope = _module("transformer_cogview4").CogView4RotaryPosEmbed(40, 1, (256, 256), theta=10000.0)
    cos, sin = rope(torch.zeros(1, 4, 16, 16))
    return cos, sin, rome.grid_positions([16, 16]) * 16  # its rows h * 256 // 16 of a 256-row table


def _cogvideox():
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    cos, sin = get_3d_rotary_pos_embed(64, ((0, 0), (4, 5)), (4, 5), 3)  # the pipeline's, embed_dim = head dim
    return cos, sin, rome.grid_positions([3, 4, 5])


PROBES = {
    "diffusers-wan": _wan("transformer_wan", "WanRotaryPosEmbed"),
    "diffusers-wan_vace": _wan("transformer_wan", "WanRotaryPosEmbed"),
    "diffusers-wan_animate": _wan("transformer_wan_animate", "WanRotaryPosEmbed"),
    "diffusers-skyreels_v2": _wan("transformer_skyreels_v2", "SkyReelsV2RotaryPosEmbed"),
    "diffusers-chronoedit": _wan("transformer_chronoedit", "ChronoEditRotaryPosEmbed"),
    "diffusers-hunyuan_video": _hunyuan("transformer_hunyuan_video", "HunyuanVideoRotaryPosEmbed", (16, 56, 56), 256.0),
    "diffusers-hunyuan_video15": _hunyuan("transformer_hunyuan_video15", "HunyuanVideo15RotaryPosEmbed",
                                          (16, 56, 56), 256.0),
    "diffusers-hunyuan_image": _hunyuan("transformer_hunyuanimage", "HunyuanImageRotaryPosEmbed", (64, 64), 256.0),
    "diffusers-hunyuan_video_framepack": _framepack,
    "diffusers-flux": _flux("transformer_flux", "FluxPosEmbed", 10000, (16, 56, 56)),
    "diffusers-chroma": _flux("transformer_flux", "FluxPosEmbed", 10000, (16, 56, 56)),
    "diffusers-flux2": _flux("transformer_flux2", "Flux2PosEmbed", 2000, (32, 32, 32, 32)),
    "diffusers-z_image": _z_image,
    "diffusers-lumina2": _lumina2,
    "diffusers-cosmos": _cosmos,
    "diffusers-cogview4": _cogview4,
    "diffusers-cogvideox": _cogvideox,
    "diffusers-consisid": _cogvideox,
}


def _layout(record: dict):
    cols = record["columns"]
    return rome.RopeLayout(torch.tensor([float.fromhex(c["inv_freq"]) for c in cols], dtype=torch.float64),
                           torch.tensor([c["axis"] for c in cols]), record["n_axes"],
                           tuple((m, s) for m, s in record["blocks"]))


@pytest.mark.parametrize("name", sorted(PROBES))
def test_diffusers_record_is_the_models_rope(name):
    """The record's frequencies and axes give the model's own tables (its rotary module's, at the
    class defaults the record names) within float32 rounding of its angles."""
    if "diffusers" in MISSING:
        pytest.skip("diffusers is not installed")
    import json

    from rome.layouts import cos_sin_for_positions

    try:
        cos, sin, positions = PROBES[name]()
    except (ImportError, AttributeError) as e:  # a diffusers version without this family's module
        pytest.skip(f"{name}: this diffusers has no such rotary module ({e})")
    record = json.loads(_committed(name))
    d = record["head_dim"]
    cos, sin = cos.reshape(-1, d).double(), sin.reshape(-1, d).double()
    ours = cos_sin_for_positions(_layout(record), positions.reshape(cos.shape[0], -1), dtype=torch.float64)
    torch.testing.assert_close(cos, ours[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(sin, ours[1], rtol=0, atol=1e-5)
