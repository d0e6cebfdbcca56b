"""Shared test fixtures: toolchain discovery and probe compilation."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

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


PROBES_DIR = Path(__file__).parent / "probes"


@pytest.fixture(scope="session")
def probe_names() -> list[str]:
    """Every probe of tests/probes, by name without ``.bpf.c``."""
    return sorted(p.name.removesuffix(".bpf.c") for p in PROBES_DIR.glob("*.bpf.c"))


@pytest.fixture(scope="session")
def probe_obj(tmp_path_factory):
    """``probe_obj("count") -> Path``: tests/probes/count.bpf.c compiled once per session (``mcpu="v4"``
    gives a separate v4 build)."""
    from egpu_preload.bpf.compile import compile_probe

    out_dir = tmp_path_factory.mktemp("probes")
    built: dict[tuple[str, str], Path] = {}

    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")  # the GPU machine has no clang: gpu-prep.sh builds there

    def build(name: str, mcpu: str = "v3") -> Path:
        if prebuilt:
            return Path(prebuilt) / f"{name}.{mcpu}.bpf.o"
        if (name, mcpu) not in built:
            built[name, mcpu] = compile_probe(PROBES_DIR / f"{name}.bpf.c", out_dir / f"{name}.{mcpu}.bpf.o",
                                              mcpu=mcpu)
        return built[name, mcpu]

    return build


EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="session")
def example_path(tmp_path_factory):
    """``example_path("access_trace") -> Path``: examples/access_trace.bpf.c compiled once per session; where
    EGPU_PREBUILT_PROBES is set (the GPU machine has no clang), its ``<name>.v3.bpf.o``."""
    from egpu_preload.bpf.compile import compile_probe

    out_dir = tmp_path_factory.mktemp("examples")
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if prebuilt:
            return Path(prebuilt) / f"{name}.v3.bpf.o"
        if name not in built:
            built[name] = compile_probe(EXAMPLES_DIR / f"{name}.bpf.c", out_dir / f"{name}.bpf.o")
        return built[name]

    return build


def pytest_runtest_logreport(report):
    """A GPU call may be cut off before pytest's summary: with EGPU_TEST_FAILURES set (scripts/gpu-test.sh),
    each failure, its traceback and its captured output are written there as it happens."""
    path = os.environ.get("EGPU_TEST_FAILURES")
    if not path or not report.failed or getattr(report, "node", None) is not None:  # xdist: its worker wrote it
        return
    with open(path, "a") as f:
        f.write(f"===== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n")
        for title, text in report.sections:
            f.write(f"----- {title}\n{text[-20000:]}\n")


def pytest_terminal_summary(terminalreporter):
    """The translator's registers and stack per program (test_translate.py), summarized."""
    from translate_support import report_lines
    lines = report_lines()
    if lines:
        terminalreporter.section("ptxas: registers and stack of the translated programs")
        for line in lines:
            terminalreporter.write_line(line)


pytest_plugins = ["stub_job"]  # jobs against the stand-in driver (test_runtime.py, test_egpu_run.py)

from test_shim import built  # noqa: E402,F401  (the shim, built once per session)


@pytest.fixture(scope="session")
def shim_api(built):  # noqa: F811
    """(ffi, lib): the shim test_shim.py builds, its C API loaded into this process ABI-mode (its Python
    never starts)."""
    return shim_api_of(built / "libegpu_shim.so")


def shim_api_of(lib: str | Path) -> tuple:
    """shim/build.py's load(): (ffi, lib) of the built shim at ``lib`` (shim_api; a subprocess of a test)."""
    spec = importlib.util.spec_from_file_location("shim_build", Path(__file__).parent.parent / "shim" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load(Path(lib))


@pytest.fixture
def ring_walk_in_c(shim_api, monkeypatch):
    """The ring reader's walk (runtime/ring_drain.py) on the shim's C, as inside a job."""
    from egpu_preload.runtime import ring_drain

    monkeypatch.setattr(ring_drain, "_shim", lambda: shim_api)
