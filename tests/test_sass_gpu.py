"""The SASS back end on the GPU (Compute Sanitizer patching API): exact counts inside kernels that ship
no PTX, outputs bit-identical, and shim/sass.c's own declarations checked against the real headers.

- nvcc program built SASS-only (sass/experiment/target.cu: vecadd and a grid-stride copy, 3 launches
  each, EXPECT lines with threads, loads, stores and bytes per launch): kernel entries (count.bpf.c)
  == launches x threads; global bytes loaded and stored per kernel (examples/mem_bytes.bpf.c) exact;
  outputs identical.
- the same probes on an nvcc program with PTX (tests/e2e/vecadd.cu) under --backend ptx and sass agree.
- stock PyTorch eager (sass/experiment/torch_prog.py: ATen add, strided copy, sum, cuBLAS matmul, cuDNN
  conv, an MLP step): entries per kernel (hash_count.bpf.c) == threads launched per kernel (launch.bpf.c,
  a launch probe, from the launch hooks), and outputs identical to a plain run (the program is
  deterministic: fixed seeds, deterministic algorithms, a fixed cuBLAS workspace).

Run by the lead: python3 -m pytest -m gpu tests/test_sass_gpu.py (about 1-2 minutes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stub_job import ROOT, egpu_run
from test_e2e_gpu import env_for, shim, split, vecadd  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu

EXPERIMENT = ROOT / "sass" / "experiment"
SAN = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "compute-sanitizer"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """target.cu as SASS only: sm_90 code, no PTX in the binary (cuobjdump lists none)."""
    exe = tmp_path_factory.mktemp("sass_target") / "target"
    cuda = Path(subprocess.run(["which", "nvcc"], capture_output=True, text=True).stdout.strip()).resolve().parents[1]
    subprocess.run(["nvcc", "-gencode", "arch=compute_90,code=sm_90", "-O2", str(EXPERIMENT / "target.cu"),
                    "-o", str(exe), f"-L{cuda}/lib64/stubs", "-lcuda", "-ldl"], check=True)
    listing = subprocess.run(["cuobjdump", "--list-ptx", str(exe)], capture_output=True, text=True)
    assert "PTX file" not in listing.stdout, listing.stdout
    return exe


def expect(lines: list[str]) -> list[dict[str, int]]:
    """target.cu's EXPECT lines (per launch, with the launch count)."""
    out = []
    for ln in lines:
        if ln.startswith("EXPECT kernel="):
            kv = dict(f.split("=", 1) for f in ln.split()[1:])
            out.append({k: int(v) for k, v in kv.items() if v.isdigit()})
    return out


def probed(cmd: list[str], probes: list[Path], shim_path: Path, tmp: Path, backend: str = "auto",
           flags: tuple[str, ...] = (), **env: str):
    """(plain run, egpu-run --json -v --backend B [FLAGS] run, the probed program's lines, its one dump)."""
    e = env_for(shim_path, tmp, **env)
    plain = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    args = ["--json", "-v", "--backend", backend, *flags]
    for p in probes:
        args += ["-p", str(p)]
    run = egpu_run(args + cmd, e, timeout=300)
    assert run.returncode == 0, run.stderr
    lines, docs = split(run.stdout)
    assert len(docs) == 1, run.stdout
    return plain, run, lines, docs[0]


def entries(doc: dict, name: str) -> dict:
    return {e["key"]: e["value"] for e in doc["maps"][name]["entries"]}


HEADER_CHECK = r"""
#include <stddef.h>
#include <stdio.h>
#include <type_traits>
#include <sanitizer.h>
/* the prototypes sass.c declares, compared by type (decltype names no symbol: nothing to link) */
#define SAME(fn, type) static_assert(std::is_convertible<decltype(&fn), type>::value, #fn " differs from sass.c's");
SAME(sanitizerSubscribe, SanitizerResult (*)(Sanitizer_SubscriberHandle *, Sanitizer_CallbackFunc, void *))
SAME(sanitizerEnableDomain, SanitizerResult (*)(uint32_t, Sanitizer_SubscriberHandle, Sanitizer_CallbackDomain))
SAME(sanitizerEnableCallback,
     SanitizerResult (*)(uint32_t, Sanitizer_SubscriberHandle, Sanitizer_CallbackDomain, Sanitizer_CallbackId))
SAME(sanitizerAddPatches, SanitizerResult (*)(const void *, CUcontext))
SAME(sanitizerPatchInstructions, SanitizerResult (*)(const Sanitizer_InstructionId, CUmodule, const char *))
SAME(sanitizerPatchModule, SanitizerResult (*)(CUmodule))
SAME(sanitizerUnpatchModule, SanitizerResult (*)(CUmodule))
SAME(sanitizerAlloc, SanitizerResult (*)(CUcontext, void **, size_t))
SAME(sanitizerMemcpyHostToDeviceAsync, SanitizerResult (*)(void *, void *, size_t, Sanitizer_StreamHandle))
SAME(sanitizerSetLaunchCallbackData,
     SanitizerResult (*)(Sanitizer_LaunchHandle, CUfunction, Sanitizer_StreamHandle, const void *))
SAME(sanitizerGetFunctionPcAndSize, SanitizerResult (*)(CUmodule, const char *, uint64_t *, uint64_t *))
SAME(sanitizerGetResultString, SanitizerResult (*)(SanitizerResult, const char **))
int main(void) {
#define OFF(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f));
    OFF(Sanitizer_LaunchData, context) OFF(Sanitizer_LaunchData, stream) OFF(Sanitizer_LaunchData, hStream)
    OFF(Sanitizer_LaunchData, module) OFF(Sanitizer_LaunchData, function) OFF(Sanitizer_LaunchData, functionName)
    OFF(Sanitizer_LaunchData, gridDim_x) OFF(Sanitizer_LaunchData, clusterDim_z) OFF(Sanitizer_LaunchData, gridId)
    OFF(Sanitizer_LaunchData, hLaunch)
    OFF(Sanitizer_ResourceModuleData, context) OFF(Sanitizer_ResourceModuleData, module)
    OFF(Sanitizer_ResourceModuleData, cubinSize) OFF(Sanitizer_ResourceModuleData, pCubin)
    OFF(Sanitizer_ResourceModuleData, library)
    printf("values %d %d %d %d %d %d %d %d %d %d %d %d\n", SANITIZER_CB_DOMAIN_RESOURCE, SANITIZER_CB_DOMAIN_LAUNCH,
           SANITIZER_CBID_RESOURCE_MODULE_LOADED, SANITIZER_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
           SANITIZER_CBID_LAUNCH_BEGIN, SANITIZER_INSTRUCTION_BLOCK_ENTER, SANITIZER_INSTRUCTION_BLOCK_EXIT,
           SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, SANITIZER_MEMORY_DEVICE_FLAG_READ,
           SANITIZER_MEMORY_DEVICE_FLAG_WRITE, SANITIZER_MEMORY_DEVICE_FLAG_ATOMSYS, SANITIZER_PATCH_SUCCESS);
    printf("prototypes 1\n");
    return 0;
}
"""

OURS = r"""
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include "sass.c"
unsigned long long egpu_py_sass_kernel(void *m, const char *n, unsigned long long g, unsigned long long *k) {
    return 0;
}
void *egpu_shim_real(const char *name) { return 0; }
int egpu_shim_bypass(int on) { return 0; }
int egpu_python_up(void) { return 1; }
void egpu_shim_eval(int on) {}
void egpu_shim_eval_device_launches(void) {}
int main(void) {
#define OFF(t, f, g) printf("%s.%s %zu\n", #t, #f, offsetof(g, f));
    OFF(Sanitizer_LaunchData, context, san_launch_data) OFF(Sanitizer_LaunchData, stream, san_launch_data)
    OFF(Sanitizer_LaunchData, hStream, san_launch_data) OFF(Sanitizer_LaunchData, module, san_launch_data)
    OFF(Sanitizer_LaunchData, function, san_launch_data) OFF(Sanitizer_LaunchData, functionName, san_launch_data)
    OFF(Sanitizer_LaunchData, gridDim_x, san_launch_data) OFF(Sanitizer_LaunchData, clusterDim_z, san_launch_data)
    OFF(Sanitizer_LaunchData, gridId, san_launch_data) OFF(Sanitizer_LaunchData, hLaunch, san_launch_data)
    OFF(Sanitizer_ResourceModuleData, context, san_module_data)
    OFF(Sanitizer_ResourceModuleData, module, san_module_data)
    OFF(Sanitizer_ResourceModuleData, cubinSize, san_module_data)
    OFF(Sanitizer_ResourceModuleData, pCubin, san_module_data)
    OFF(Sanitizer_ResourceModuleData, library, san_module_data)
    printf("values %d %d %d %d %d %d %d %d %d %d %d %d\n", SAN_DOMAIN_RESOURCE, SAN_DOMAIN_LAUNCH,
           SAN_CBID_MODULE_LOADED, SAN_CBID_MODULE_UNLOAD_STARTING, SAN_CBID_LAUNCH_BEGIN, 1, 2, 3, 1, 2, 4, 0);
    printf("prototypes 1\n");
    return 0;
}
"""


def test_declarations_match_the_real_headers(tmp_path):
    """shim/sass.c declares the sanitizer's structs, enums and prototypes itself: the real headers agree
    (and sass_patch.py's instruction ids and flag bits, listed as literals in OURS)."""
    if not (SAN / "include" / "sanitizer.h").exists():
        pytest.skip(f"no sanitizer headers under {SAN}")
    cuda_inc = SAN.parent / "include"
    (tmp_path / "real.cpp").write_text(HEADER_CHECK)   # C++: a prototype unlike ours does not compile
    (tmp_path / "ours.c").write_text(OURS)
    subprocess.run(["g++", "-std=c++17", "-I", str(SAN / "include"), "-I", str(cuda_inc), "real.cpp", "-o", "real"],
                   cwd=tmp_path, check=True)
    subprocess.run(["gcc", "-std=gnu11", "-I", str(ROOT / "shim"), "ours.c", "-o", "ours", "-ldl", "-lpthread"],
                   cwd=tmp_path, check=True)
    real = subprocess.run([str(tmp_path / "real")], capture_output=True, text=True, check=True).stdout
    ours = subprocess.run([str(tmp_path / "ours")], capture_output=True, text=True, check=True).stdout
    assert real == ours


@pytest.mark.parametrize("flags, served", [((), "counted at the launch"), (("--in-kernel",), "SASS patch")],
                         ids=["counted", "in-kernel"])
def test_sass_only_program_counts_every_thread(target, shim, probe_obj, tmp_path, flags, served):  # noqa: F811
    """count.bpf.c adds 1 at every entry: counted by the shim at each launch (launch_eval.py), or run by every
    thread in the patch (--in-kernel); the same count either way."""
    plain, run, lines, doc = probed([str(target), "plain"], [probe_obj("count")], shim, tmp_path, flags=flags)
    assert lines == plain.stdout.splitlines()   # HASH and VERIFY lines: bit-identical
    want = expect(lines)
    assert doc["maps"]["counts"]["value"] == sum(e["launches"] * e["threads"] for e in want), run.stderr
    assert f"_Z6vecaddPKfS0_Pfi: instrumented ({served})" in run.stderr   # -v: the kernels it served


def test_sass_only_program_memory_bytes_exact(target, shim, probe_obj, tmp_path):  # noqa: F811
    """examples/mem_bytes.bpf.c: bytes loaded and stored per kernel, vecadd (2 loads, 1 store per element)
    and copyk (1 and 1) each launched 3 times, exact. (tests/probes/memtrace.bpf.c would count them too, but
    the prebuilt probes are named by file name alone and examples/memtrace.bpf.c, a record per access,
    takes its name there.)"""
    plain, run, lines, doc = probed([str(target), "plain"], [probe_obj("mem_bytes")], shim, tmp_path)
    assert lines == plain.stdout.splitlines()
    want = {}
    for ln in lines:
        if ln.startswith("EXPECT kernel="):
            kv = dict(f.split("=", 1) for f in ln.split()[1:])
            n = int(kv["launches"])
            want[kv["kernel"]] = (n * int(kv["ldbytes"]), n * int(kv["stbytes"]))
    assert set(want) == {"vecadd", "copyk"}, lines
    names = {str(k): n for k, n in doc["kernels"].items()}
    got = {}
    for e in doc["maps"]["traffic"]["entries"]:
        mangled = names.get(str(e["key"]), str(e["key"]))
        got[unmangled(mangled)] = (e["value"]["loaded"], e["value"]["stored"])
    assert got == want, run.stderr


def unmangled(name: str) -> str:
    """The function name in an Itanium-mangled one (_Z6vecaddPKfS0_Pfi -> vecadd); others as they are."""
    m = re.match(r"_Z(\d+)", name)
    return name[m.end():m.end() + int(m.group(1))] if m else name


@pytest.mark.parametrize("backend", ["ptx", "sass"])
def test_program_with_ptx_counts_the_same_on_both_back_ends(vecadd, shim, probe_obj, tmp_path, backend):  # noqa: F811
    plain, run, lines, doc = probed([str(vecadd["static"]), "10", str(1 << 20)], [probe_obj("count")], shim,
                                    tmp_path, backend=backend)
    assert lines == plain.stdout.splitlines()
    assert doc["maps"]["counts"]["value"] == 10 * (1 << 20), run.stderr


def _torch() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _torch(), reason="PyTorch with CUDA is not installed")
def test_pytorch_eager_entries_equal_launched_threads(shim, probe_obj, tmp_path):  # noqa: F811
    cmd = [sys.executable, str(EXPERIMENT / "torch_prog.py")]
    plain, run, lines, doc = probed(cmd, [probe_obj("hash_count"), probe_obj("launch")], shim, tmp_path)
    hashes = [ln for ln in lines if ln.startswith("HASH")]
    assert len(hashes) == 7
    assert hashes == [ln for ln in plain.stdout.splitlines() if ln.startswith("HASH")]
    entered = entries(doc, "per_kernel")
    launched = {k: v["threads"] for k, v in entries(doc, "launches").items()}
    names = {str(k): n for k, n in doc.get("kernels", {}).items()} if isinstance(doc.get("kernels"), dict) else {}
    assert len(launched) >= 10, launched
    wrong = {names.get(str(k), k): (entered.get(k), t) for k, t in launched.items() if entered.get(k) != t}
    assert not wrong, f"kernel: (entries, launched threads) {json.dumps(wrong, default=str)[:2000]}"


@pytest.mark.skipif(not _torch(), reason="PyTorch with CUDA is not installed")
def test_pytorch_eager_entries_counted_at_the_launch(shim, probe_obj, tmp_path):  # noqa: F811
    """count.bpf.c's counter on stock PyTorch: no kernel patched, every launch counted by the shim, the sum
    equal to the threads a launch probe saw launched; nothing ended the counting (egpu-run -v would say)."""
    cmd = [sys.executable, str(EXPERIMENT / "torch_prog.py")]
    plain, run, lines, doc = probed(cmd, [probe_obj("count"), probe_obj("launch")], shim, tmp_path)
    assert [ln for ln in lines if ln.startswith("HASH")] == [ln for ln in plain.stdout.splitlines()
                                                            if ln.startswith("HASH")]
    launched = sum(v["threads"] for v in entries(doc, "launches").values())
    assert launched > 0 and doc["maps"]["counts"]["value"] == launched, run.stderr
    assert "patched into the kernels from now on" not in run.stderr and "(counted at the launch)" in run.stderr


@pytest.mark.skipif(not _torch(), reason="PyTorch with CUDA is not installed")
def test_pytorch_eager_memory_bytes_exact(shim, probe_obj, tmp_path):  # noqa: F811
    """examples/mem_bytes.bpf.c on stock PyTorch kernels (SASS patched): an elementwise add and a strided
    copy, each one kernel whose bytes loaded and stored are known (tests/e2e/torch_bytes.py); outputs
    identical to a run without egpu."""
    cmd = [sys.executable, str(ROOT / "tests" / "e2e" / "torch_bytes.py")]
    plain, run, lines, doc = probed(cmd, [probe_obj("mem_bytes")], shim, tmp_path)
    assert [ln for ln in lines if ln.startswith("HASH")] == [ln for ln in plain.stdout.splitlines()
                                                            if ln.startswith("HASH")]
    want = sorted(tuple(int(f.split("=")[1]) for f in ln.split()[1:]) for ln in lines if ln.startswith("EXPECT"))
    got = sorted((e["value"]["loaded"], e["value"]["stored"]) for e in doc["maps"]["traffic"]["entries"])
    assert got == want, run.stderr
