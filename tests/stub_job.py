"""Fixtures for the runtime and egpu-run tests (registered by conftest.py): jobs run against the
stand-in driver of tests/stub_driver, extended with tests/runtime_stub/driver_more.c, under the shim
test_shim.py builds."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_shim import built  # noqa: F401  (the shim, built once per session)

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "tests" / "stub_driver"
MORE = ROOT / "tests" / "runtime_stub"


@dataclass(frozen=True)
class StubJob:
    """What a job against the stand-in needs: the shim, a directory holding the stand-in libcuda.so.1,
    and the C apps (the Python one is MORE/app_vec.py; loop: MORE/app_loop.c, a job to attach to)."""
    shim: Path
    driver_dir: Path
    app: Path
    loop: Path

    def env(self, log: Path, **extra: str) -> dict[str, str]:
        """The test's environment for egpu-run: the stand-in found first, its log in ``log``, sessions
        beside it (XDG_RUNTIME_DIR), so that kept ones go with the test's directory."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU")}
        env.update(LD_LIBRARY_PATH=str(self.driver_dir), EGPU_STUB_LOG=str(log), EGPU_SHIM=str(self.shim),
                   PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(log.parent))
        env.update(extra)
        return env


@pytest.fixture(scope="session")
def stub_job(built, tmp_path_factory) -> StubJob:  # noqa: F811
    d = tmp_path_factory.mktemp("runtime_stub")
    cc = ["gcc", "-O1", "-Wall", "-Werror"]
    steps = [cc + ["-shared", "-fPIC", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1", str(STUB / "libcuda_stub.c"),
                   str(MORE / "driver_more.c"), "-o", str(d / "libcuda.so.1")],
             cc + [str(MORE / "app_vec.c"), "-o", str(d / "app_vec"), "-ldl"],
             cc + [str(MORE / "app_loop.c"), "-o", str(d / "app_loop"), "-ldl"]]
    for p in [subprocess.Popen(s) for s in steps]:
        assert p.wait() == 0, p.args
    return StubJob(built / "libegpu_shim.so", d, d / "app_vec", d / "app_loop")


def egpu_run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """egpu-run ARGS as the console script runs it."""
    return subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
