import os

import pytest
import torch

# Without a GPU the Triton kernel runs on the CPU through Triton's interpreter. The variable
# must be set before rome's kernel module is first imported (rome imports it lazily).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ("torch", "triton")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SECTIONS = {"3d-44/44/40": (44, 44, 40), "3d-16/56/56": (16, 56, 56), "3d-16/24/24": (16, 24, 24),
            "1d-64": (64,)}
MODES = ("interleave", "half")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
