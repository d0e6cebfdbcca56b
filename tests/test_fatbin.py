"""The fatbin reader on real nvcc 13.0 output, built here: every compression mode, -rdc, several archs."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from egpu_preload import fatbin as F
from egpu_preload.errors import FatbinError

KERNELS = """
__global__ void add(float *a, float b, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] += b; }
__device__ int counter;
__global__ void count(int *out) { /* comments vanish in fatbin PTX */ out[threadIdx.x] = atomicAdd(&counter, 1); }
"""
OTHER = "__global__ void scale(float *a, float s) { a[threadIdx.x] *= s; }\n"
ARCHS = ["-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_80,code=compute_80",
         "-gencode", "arch=compute_90,code=[sm_90,compute_90]"]

# name -> nvcc arguments (after the source); every build runs at once in the fixture.
BUILDS = {
    "default": ["-fatbin", *ARCHS],
    "speed": ["-fatbin", "--compress-mode=speed", *ARCHS],
    "size": ["-fatbin", "--compress-mode=size", *ARCHS],
    "none": ["-fatbin", "--compress-mode=none", *ARCHS],
    "rdc": ["-c", "-rdc=true", "-gencode", "arch=compute_80,code=[sm_80,compute_80]"],
    "sm100": ["-fatbin", "-gencode", "arch=compute_100,code=sm_100"],
    "specific": ["-fatbin", "-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]", "-gencode",
                 "arch=compute_100f,code=compute_100f", "-gencode", "arch=compute_80,code=compute_80"],
    "lto": ["-fatbin", "-gencode", "arch=compute_90,code=lto_90", "-gencode", "arch=compute_80,code=compute_80"],
}


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, Path]:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.fail("nvcc is required for the fatbin tests (CUDA toolkit)")
    d = tmp_path_factory.mktemp("fatbin")
    (d / "k.cu").write_text(KERNELS)
    (d / "other.cu").write_text(OTHER)
    out = {name: d / f"k_{name}.bin" for name in BUILDS}
    procs = [subprocess.Popen([nvcc, "k.cu", *args, "-o", out[name].name], cwd=d)
             for name, args in BUILDS.items()]
    # --keep leaves the PTX nvcc -ptx would print beside the fatbin it embeds it in
    out["keep"] = d / "keep"
    out["keep"].mkdir()
    procs.append(subprocess.Popen([nvcc, "k.cu", "-fatbin", *ARCHS, "--keep", "--keep-dir", "keep",
                                   "-o", "kept.fatbin"], cwd=d))
    out["shared"] = d / "libk.so"  # two translation units: several fatbins in one library
    procs.append(subprocess.Popen([nvcc, "-shared", "-Xcompiler", "-fPIC", "k.cu", "other.cu",
                                   "-o", "libk.so"], cwd=d))
    for p in procs:
        assert p.wait() == 0, p.args
    return out


def entries(path: Path) -> list[tuple[str, int, str]]:
    return [(e.kind.name, e.arch, e.compression)
            for fb in F.find_fatbins(path.read_bytes()) for e in fb.entries]


# Which entry nvcc 13.0 compresses how, per --compress-mode (measured: speed = LZ4, size = Zstd for
# SASS too, default = Zstd for PTX only).
@pytest.mark.parametrize("build, expected", [
    ("default", [("ELF", 75, "none"), ("PTX", 80, "zstd"), ("ELF", 90, "none"), ("PTX", 90, "zstd")]),
    ("speed", [("ELF", 75, "none"), ("PTX", 80, "lz4"), ("ELF", 90, "none"), ("PTX", 90, "lz4")]),
    ("size", [("ELF", 75, "zstd"), ("PTX", 80, "zstd"), ("ELF", 90, "zstd"), ("PTX", 90, "zstd")]),
    ("none", [("ELF", 75, "none"), ("PTX", 80, "none"), ("ELF", 90, "none"), ("PTX", 90, "none")]),
])
def test_entries_per_compress_mode(built, build, expected):
    assert entries(built[build]) == expected


def ptx_tokens(text: str) -> list[str]:
    """PTX as a token stream: comments dropped, whitespace irrelevant (fatbin PTX is normalized)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    return re.findall(r'"[^"]*"|[\w.$%]+|\S', text)


@pytest.mark.parametrize("build", ["default", "speed", "size", "none"])
@pytest.mark.parametrize("arch", [80, 90])
def test_ptx_equals_nvcc_ptx(built, build, arch):
    entry = F.best_ptx(F.find_fatbins(built[build].read_bytes()), arch)
    assert entry is not None and entry.arch == arch
    expected = (built["keep"] / f"k.compute_{arch}.ptx").read_text()
    assert ptx_tokens(entry.ptx()) == ptx_tokens(expected)
    assert entry.ptx() != expected  # really the normalized text, not a copy of the file


def test_every_entry_decodes_to_its_size(built):
    for build in ("default", "speed", "size", "none"):
        for fb in F.find_fatbins(built[build].read_bytes()):
            for e in fb.entries:
                data = e.data()
                assert len(data) == e.size
                assert data.startswith(b"\x7fELF") if e.kind == F.Kind.ELF else b".version" in data


@pytest.mark.parametrize("sm, arch", [(75, None), (80, 80), (86, 80), (89, 80), (90, 90), (120, 90)])
def test_best_ptx_is_highest_arch_not_above_device(built, sm, arch):
    entry = F.best_ptx(F.find_fatbins(built["default"].read_bytes()), sm)
    assert (entry.arch if entry else None) == arch


@pytest.mark.parametrize("sm, name", [(80, "compute_80"), (89, "compute_80"), (90, "compute_90a"),
                                      (100, "compute_100f"), (103, "compute_100f"), (120, "compute_80")])
def test_best_ptx_takes_arch_and_family_specific_ptx_only_where_it_runs(built, sm, name):
    """Found by the PTX sweep: compute_90a PTX read as compute_90 was chosen for an sm_100 device, whose
    driver refuses to JIT it, although the fatbin's compute_80 PTX runs there."""
    fatbins = F.find_fatbins(built["specific"].read_bytes())
    assert [F.entry_name(e) for fb in fatbins for e in fb.entries] == \
        ["sm_90a", "compute_90a", "compute_100f", "compute_80"]
    entry = F.best_ptx(fatbins, sm)
    assert F.entry_name(entry) == name
    assert re.search(rf"^\.target\s+sm_{name.removeprefix('compute_')}\b", entry.ptx(), re.M)


def test_entries_of_other_kinds_are_kept_and_the_ptx_beside_them_found(built):
    """nvcc's code=lto_90 (NVVM IR for link-time optimization, kind 8) made the whole fatbin unreadable
    ("unknown kind 8"), so its PTX was never instrumented and egpu inspect refused the file; a kind this
    reader does not know (0x40 here) is kept unread the same way."""
    data = built["lto"].read_bytes()
    [fb] = F.find_fatbins(data)
    assert [(e.kind, F.entry_name(e)) for e in fb.entries] == [(F.Kind.LTO, "lto_90"), (F.Kind.PTX, "compute_80")]
    assert F.entry_name(F.best_ptx([fb], 90)) == "compute_80"
    other = bytearray(data)
    struct.pack_into("<H", other, fb.entries[0].offset, 0x40)
    [fb] = F.find_fatbins(bytes(other))
    assert [F.entry_name(e) for e in fb.entries] == ["kind_0x40_90", "compute_80"]
    assert any(line.split()[:2] == ["KIND_0x40", "kind_0x40_90"] for line in F.listing([fb]))


def test_binary_data_in_the_options_slot_is_not_taken_for_options(built):
    """Found by the PTX sweep: nvcc 13.0's sm_100 cubins keep 36 bytes of binary data where ptxas
    options go, and egpu inspect printed them, NULs and control characters, as the entry's options."""
    [fb] = F.find_fatbins(built["sm100"].read_bytes())
    assert [(F.entry_name(e), e.options) for e in fb.entries] == [("sm_100", "")]
    assert not any("[" in line for line in F.listing([fb]))


def test_rdc_object_keeps_relocatable_code_in_nv_relfatbin(built):
    [fb] = F.find_fatbins(built["rdc"].read_bytes())
    assert fb.section == "__nv_relfatbin"
    assert [(e.kind.name, e.arch) for e in fb.entries] == [("ELF", 80), ("PTX", 80)]
    assert fb.entries[1].options == "--compile-only"
    assert ".extern" in fb.entries[1].ptx() or ".visible .global" in fb.entries[1].ptx()


def test_shared_library_fatbins_and_wrappers(built):
    """Each wrapper in .nvFatBinSegment points at one of the fatbins found in .nv_fatbin; the static
    cudart's own module comes with a version 2 wrapper, the user's translation units with version 1."""
    import io
    from elftools.elf.elffile import ELFFile
    data = built["shared"].read_bytes()
    fatbins = F.find_fatbins(data)
    kernels = {name for fb in fatbins for e in fb.entries if e.kind == F.Kind.PTX
               for name in re.findall(r"\.entry (\w+)", e.ptx())}
    assert {"_Z3addPffi", "_Z5countPi", "_Z5scalePff"} <= kernels
    elf = ELFFile(io.BytesIO(data))
    fatbin_sec = elf.get_section_by_name(".nv_fatbin")
    seg = elf.get_section_by_name(".nvFatBinSegment").data()
    addrs = {fb.offset - fatbin_sec["sh_offset"] + fatbin_sec["sh_addr"] for fb in fatbins}
    wrappers = [F.parse_wrapper(seg, off) for off in range(0, len(seg), F.WRAPPER.size)]
    assert sorted(v for v, _, _ in wrappers) == [1, 1, 2]
    assert {addr for _, addr, _ in wrappers} == addrs


@pytest.mark.parametrize("head, kind", [
    (struct.pack("<IIQQ", F.WRAPPER_MAGIC, 1, 0, 0), F.ImageKind.WRAPPER),
    (struct.pack("<IHHQ", F.FATBIN_MAGIC, 1, 16, 0), F.ImageKind.FATBIN),
    (b"\x7fELF\x02\x01", F.ImageKind.ELF),
    (b"\n\n.version 9.0\n", F.ImageKind.PTX),
    (b"//\n// Generated by NVIDIA NVVM Compiler\n", F.ImageKind.PTX),
    (b"\x00\x01\x02\x03", F.ImageKind.UNKNOWN),
])
def test_image_kind(head, kind):
    assert F.image_kind(head) == kind


@pytest.mark.parametrize("data, reason", [
    (b"", "runs past the end"),
    (struct.pack("<IHHQ", 0x12345678, 1, 16, 0), "bad fatbin magic"),
    (struct.pack("<IHHQ", F.FATBIN_MAGIC, 2, 16, 0), "unknown version"),
    (struct.pack("<IHHQ", F.FATBIN_MAGIC, 1, 16, 64), "runs past the end"),
    (struct.pack("<IHHQ", F.FATBIN_MAGIC, 1, 16, 64) + struct.pack("<HHIQ", 1, 0x101, 64, 8) + bytes(48),
     "overrun"),
])
def test_corrupt_fatbins_are_refused(data, reason):
    with pytest.raises(FatbinError, match=reason):
        F.parse_fatbin(data)


def test_wrapper_versions():
    assert F.parse_wrapper(struct.pack("<IIQQ", F.WRAPPER_MAGIC, 2, 0x1000, 0x2000)) == (2, 0x1000, 0x2000)
    with pytest.raises(FatbinError, match="unknown version 3"):
        F.parse_wrapper(struct.pack("<IIQQ", F.WRAPPER_MAGIC, 3, 0, 0))


@pytest.fixture(scope="session")
def samples(built) -> list[bytes]:
    """One real fatbin per compression mode, as bytes to mutate."""
    return [built[b].read_bytes() for b in ("default", "speed", "size", "none")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_fatbins_raise_only_fatbin_error(samples, data):
    blob = bytearray(data.draw(st.sampled_from(samples)))
    for _ in range(data.draw(st.integers(1, 8))):
        # Aim half the mutations at the headers (first 16 + 96 bytes of each entry) where they bite.
        pos = data.draw(st.one_of(st.integers(0, 127), st.integers(0, len(blob) - 1)))
        blob[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del blob[data.draw(st.integers(0, len(blob))):]
    try:
        for fb in F.find_fatbins(bytes(blob)):
            for e in fb.entries:
                e.ptx() if e.kind == F.Kind.PTX else e.data()
    except FatbinError:
        pass


def test_inspect_command_lists_and_extracts(built, tmp_path):
    from typer.testing import CliRunner
    import launcher
    result = CliRunner().invoke(launcher.egpu, ["inspect", str(built["default"]),
                                                "--extract-ptx", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("fatbin #1: offset 0x0")
    assert [ln.split()[:2] for ln in lines[1:5]] == [["ELF", "sm_75"], ["PTX", "compute_80"],
                                                     ["ELF", "sm_90"], ["PTX", "compute_90"]]
    assert "zstd" in lines[2] and "none" in lines[1]
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["k_default.bin.1.compute_80.ptx", "k_default.bin.1.compute_90.ptx"]


def test_inspect_command_refuses_unreadable_file(tmp_path):
    from typer.testing import CliRunner
    import launcher
    result = CliRunner().invoke(launcher.egpu, ["inspect", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "cannot read" in result.output


def test_inspect_command_says_what_a_file_without_a_fatbin_is(built, tmp_path):
    """Found by the PTX sweep: a truncated fatbin and a cubin were both reported as 'no CUDA device code
    (no fatbin in it)'."""
    from typer.testing import CliRunner
    import launcher
    data = built["default"].read_bytes()
    (tmp_path / "cut.fatbin").write_bytes(data[:len(data) // 2])
    cubin = next(e for fb in F.find_fatbins(data) for e in fb.entries if e.kind == F.Kind.ELF).data()
    (tmp_path / "k.cubin").write_bytes(cubin)
    for name, reason in [("cut.fatbin", "fatbin at 0 runs past the end"), ("k.cubin", "a cubin (device code")]:
        result = CliRunner().invoke(launcher.egpu, ["inspect", str(tmp_path / name)])
        assert result.exit_code == 1 and reason in result.output and "no CUDA device code" not in result.output


def test_inspect_and_rewrite_say_what_device_code_they_were_given(built, tmp_path, probe_obj):
    """Each command handed the other's input: inspect called PTX "1196 bytes of something else", rewrite
    called a fatbin, a cubin and an object "binary data (byte 1 is not UTF-8 text)". Each says what the file
    is and what reads it."""
    from typer.testing import CliRunner
    import launcher
    data = built["default"].read_bytes()
    entries = [e for fb in F.find_fatbins(data) for e in fb.entries]
    (tmp_path / "k.ptx").write_text(next(e for e in entries if e.kind == F.Kind.PTX).ptx())
    (tmp_path / "k.cubin").write_bytes(next(e for e in entries if e.kind == F.Kind.ELF).data())
    for args, reason in [
            (["inspect", tmp_path / "k.ptx"], "PTX text, not a binary: it holds no fatbin (egpu rewrite instruments "
                                              "its kernels)"),
            (["rewrite", built["default"], "-p", probe_obj("count")],
             "not PTX: a fatbin (egpu inspect --extract-ptx DIR writes its PTX entries)"),
            (["rewrite", built["rdc"], "-p", probe_obj("count")],
             "not PTX: an ELF file (egpu inspect lists the device code it embeds; --extract-ptx DIR writes its PTX)"),
            (["rewrite", tmp_path / "k.cubin", "-p", probe_obj("count")],
             "not PTX: a cubin, SASS for one GPU (it has no PTX to rewrite)")]:
        result = CliRunner().invoke(launcher.egpu, [str(a) for a in args])
        assert (result.exit_code, result.stderr) == (1, f"egpu: {args[1]}: {reason}\n")


def test_inspect_names_the_file_of_a_ptx_entry_that_does_not_decode(built, tmp_path):
    """Found by mutating fatbins: --extract-ptx of a PTX entry whose size or bytes are wrong said
    "egpu: entry at 16: ..." without the file."""
    from typer.testing import CliRunner
    import launcher
    data = bytearray(built["default"].read_bytes())
    ptx = next(e for fb in F.find_fatbins(bytes(data)) for e in fb.entries if e.compression == "zstd")
    struct.pack_into("<Q", data, ptx.offset + 56, ptx.uncompressed_size + 1)   # the header's uncompressed_size
    bad = tmp_path / "bad.fatbin"
    bad.write_bytes(data)
    result = CliRunner().invoke(launcher.egpu, ["inspect", str(bad), "--extract-ptx", str(tmp_path / "out")])
    assert result.exit_code == 1 and result.stderr == (f"egpu: {bad}: entry at {ptx.offset}: decoded "
                                                       f"{ptx.uncompressed_size} bytes, header says "
                                                       f"{ptx.uncompressed_size + 1}\n")


def _elf_with_names_at(offset: int) -> bytes:
    """An ELF64 header and two section headers, the second the section-name table at ``offset``."""
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, 64, 0, 64, 0, 0, 64, 2, 1)
    null = bytes(64)
    names = struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, offset, 16, 0, 0, 1, 0)   # SHT_STRTAB
    return header + null + names


def test_an_elf_whose_fields_point_outside_it_is_refused_as_fatbin_error():
    """Found by mutating nvcc objects: a section-name table past 2**63 (pyelftools' seek raises
    OverflowError) is a FatbinError, which egpu inspect prints by name, not a traceback; one merely past
    the end of the file names no section, and the file is scanned for fatbins as one without sections."""
    with pytest.raises(FatbinError, match="not a readable ELF file"):
        F.find_fatbins(_elf_with_names_at(2**63 - 1))
    assert F.find_fatbins(_elf_with_names_at(10**6)) == []
