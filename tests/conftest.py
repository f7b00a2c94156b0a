import os

import pytest
import torch
from hypothesis import settings

# Without a GPU the Triton kernel runs on the CPU through Triton's interpreter. The variable
# must be set before rome's kernel module is first imported (rome imports it lazily).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Hypothesis profiles (tests/test_fuzz.py). "rome", the default: bounded, so `make test` stays
# quick under the interpreter, and no example database (a failure is not replayed by the next
# run: its printed case and blob reproduce it). "fuzz" (`make fuzz`, --hypothesis-profile=fuzz):
# thousands of examples per test, failures kept in .hypothesis/ (which Hypothesis gitignores)
# and replayed first next time. deadline=None: interpreter launches vary a lot in time.
settings.register_profile("rome", max_examples=150, deadline=None, database=None, print_blob=True)
settings.register_profile("fuzz", max_examples=3000, deadline=None, print_blob=True)
settings.load_profile("rome")
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
