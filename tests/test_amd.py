"""ROCm builds of torch: which backend ``"auto"`` takes, and the options a HIP launch passes.

No AMD GPU here: a ROCm torch is stood in for by ``torch.version.hip`` and the device's
``gcnArchName`` (monkeypatched); its tensors report ``is_cuda`` like CUDA ones, which a stand-in
for x0 gives. The static side (every configuration compiled for gfx942) is
tests/test_kernels_static.py; docs/amd.md says what is known and what is not.
"""

import types

import pytest
import torch

from rome import launch, ops


@pytest.fixture
def rocm(monkeypatch):
    """A ROCm build whose device i has gcnArchName ``archs[i]`` (set by the test)."""
    archs = {}
    monkeypatch.setattr(torch.version, "hip", "6.4.43482", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(gcnArchName=archs[i], multi_processor_count=304))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    ops._gcn_arch.cache_clear()
    yield archs
    ops._gcn_arch.cache_clear()


def test_auto_on_rocm_takes_the_kernel_only_for_compiled_archs(rocm):
    rocm.update({0: "gfx942:sramecc+:xnack-", 1: "gfx90a:sramecc+:xnack-", 2: "gfx950", 3: "gfx1100",
                 4: "gfx908:sramecc+:xnack-", 5: "gfx1201"})
    want = {i: rocm[i].split(":")[0] in launch.HIP_ARCHS for i in rocm}
    assert {i: ops._kernel_arch_ok(torch.device("cuda", i)) for i in rocm} == want
    # the archs whose every configuration is in the committed table (docs/amd.md), gfx942 among them
    assert "gfx942" in launch.HIP_ARCHS and set(launch.HIP_ARCHS) <= {"gfx90a", "gfx942", "gfx950"}
    assert want[0] and not want[3] and not want[4] and not want[5]
    # a device without an index is the current one (0 here)
    assert ops._kernel_arch_ok(torch.device("cuda"))


class _RocmTensor(torch.Tensor):
    """A CPU tensor that reports ``is_cuda`` as a ROCm build's GPU tensors do (its device stays the
    CPU, index None: the current device's arch decides)."""

    @property
    def is_cuda(self):
        return True


def test_auto_backend_decision_on_rocm(rocm):
    """``_check``'s choice for a ROCm tensor: the kernel on launch.HIP_ARCHS, the torch
    backend on others; an explicit backend="triton" is kept (the user asked for it); float64 and D > 256
    take the torch backend on any arch."""
    x = torch.Tensor._make_subclass(_RocmTensor, torch.zeros(2, 8, 64))
    x64 = torch.Tensor._make_subclass(_RocmTensor, torch.zeros(2, 8, 64, dtype=torch.float64))
    cos = sin = torch.zeros(8, 64)
    m = torch.eye(64)
    for arch, want in (("gfx942:sramecc+:xnack-", "triton"), ("gfx1100", "torch"), ("gfx908", "torch"),
                       *((a, "triton") for a in launch.HIP_ARCHS)):
        rocm[0] = arch
        ops._gcn_arch.cache_clear()
        assert ops._check({"x": x}, cos, sin, m, "auto") == want, arch
        assert ops._check({"x": x}, cos, sin, m, "triton") == "triton"
        assert ops._check({"x": x64}, cos.double(), sin.double(), m.double(), "auto") == "torch"
    # the same tensor on a CUDA build: the kernel, whatever gcnArchName would say
    torch.version.hip = None
    assert ops._check({"x": x}, cos, sin, m, "auto") == "triton"


def test_auto_on_a_cuda_build_is_unchanged(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    called = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: called.append(i))
    assert ops._kernel_arch_ok(torch.device("cuda", 3)) and not called


def test_hip_launch_options():
    """A HIP launch passes no CUDA-only option: Triton's JIT raises KeyError for a keyword its
    backend does not know (maxnreg on HIP), and compiles what HIPOptions lists."""
    from triton.backends.amd.compiler import HIPOptions

    cfg = launch.choose_gather(torch.bfloat16, torch.float32, 128, transpose=False)
    assert cfg.options == {"enable_fp_fusion": False} | ({"maxnreg": 128} if launch._HAS_MAXNREG else {})
    hip = launch.target_options(cfg.options, "hip")
    assert hip == {"enable_fp_fusion": False}
    assert set(hip) <= set(HIPOptions.__dataclass_fields__)
    assert launch.target_options(cfg.options, "cuda") == cfg.options
    with pytest.raises(ValueError, match="'metal'"):
        launch.target_options(cfg.options, "metal")


def test_runtime_backend_follows_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.43482", raising=False)
    assert launch.runtime_backend() == "hip"
    cfg = launch.choose(torch.float16, torch.float16, 64, transpose=True, gather=False, exact_in_x=False,
                        exact_in_bf16=False, product="dot")
    assert "maxnreg" not in launch.target_options(cfg.options)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert launch.runtime_backend() == "cuda"
    assert launch.target_options(cfg.options) == cfg.options


def test_hip_archs_are_the_archs_of_the_committed_clean_table():
    """backend="auto" takes the kernel on an AMD arch only where the committed table
    (profiling/results/cpu/kernels-amd, docs/amd.md) compiled every configuration for it with no
    memory spill and within the LDS: the table's archs are launch.HIP_ARCHS, each clean."""
    import json
    from pathlib import Path

    table = Path(__file__).resolve().parents[1] / "profiling/results/cpu/kernels-amd/kernels.json"
    rows = json.loads(table.read_text())["rows"]
    assert {r["arch"] for r in rows} == set(launch.HIP_ARCHS)
    per_arch = {a: [r for r in rows if r["arch"] == a] for a in launch.HIP_ARCHS}
    assert len({len(v) for v in per_arch.values()}) == 1  # the same configurations for each
    for arch, rs in per_arch.items():
        bad = [r["config"] for r in rs if not r["ok"] or r["vgpr_spill_count"] or r["scratch_bytes"]
               or not r["fits_lds"]]
        assert not bad, (arch, bad[:5])
