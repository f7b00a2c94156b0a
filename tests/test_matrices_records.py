"""matrices/ (issue 30): the committed records hold rome's builders to every family's M, frequencies
and axes, and the command that writes them is deterministic.

- every record matches what rome's builders give for its source config now (``RoPE.from_hf_config``
  on the transformers config, the section/mRoPE/LTX layouts of the diffusers families, the seed's and
  the generic builders' calls), column by column: ``src`` and ``sign`` of M, the axis and the
  inverse frequency as ``float.hex`` (bitwise);
- every record's M is also rebuilt from its own fields with ``rome.rotation_matrix`` (one block per
  section, zero on the pass-through columns), and for a diffusers family agrees on its rotated
  columns with the one ``rotation_matrix(head_dim, mode)`` the patch applies;
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
