"""Shared test set-up: the gpu marker skips cleanly where there is no CUDA device."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def has_nvcc() -> bool:
    from dwgen.build import cuda_home

    home = cuda_home()
    return bool(home) and os.path.exists(os.path.join(home, "bin", "nvcc")) or bool(shutil.which("nvcc"))


def pytest_collection_modifyitems(config, items):
    gpu = has_gpu()
    nvcc = has_nvcc()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (run tests/gpu on the GPU host)"))
        if "nvcc" in item.keywords and not nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc (set CUDA_HOME)"))
