"""Shared test fixtures: toolchain discovery and probe compilation."""

from __future__ import annotations

import shutil

import pytest


def _has_gpu() -> bool:
    try:
        from cuda.bindings import driver
        err, = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, n = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and n > 0
    except Exception:  # no driver library at all
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run by make gpu-test)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ptxas() -> str:
    path = shutil.which("ptxas")
    assert path, "ptxas is required for the tests (CUDA toolkit)"
    return path
