"""Counters striped over SMs (translate/striping.py): the verifier's record of how each map's values are
used, which maps that stripes, the device image of a striped map summed back lane by lane
(devmaps.py), and the PTX that finds this SM's row."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.program import MAP_ARRAY, MAP_PERCPU_ARRAY, BpfObject, MapDef
from egpu_preload.bpf.verifier import verify
from egpu_preload.maps import MapsState
from egpu_preload.translate import probe_object_ptx
from egpu_preload.translate.devmaps import HEADER, LINE, SPREAD, SPREAD_BYTES, apply_region, layout, region_image
from egpu_preload.translate.striping import STRIPE_ROW_MAX, stripe_counters
from tests.verifier_cases import LOOKUP_ARR, MAPS

FOUND = LOOKUP_ARR + "    if r0 == 0 goto out\n"
OUT = "out:\n    r0 = 0\n    exit"


@pytest.mark.parametrize("body, uses", [
    ("r1 = 1\nlock *(u64 *)(r0 + 0x8) += r1\n", {"add8"}),
    ("w1 = 1\nlock *(u32 *)(r0 + 0x4) += w1\n", {"add4"}),
    ("r1 = 1\nr1 = atomic_fetch_add((u64 *)(r0 + 0x0), r1)\n", {"atomic"}),
    ("r1 = 1\nlock *(u64 *)(r0 + 0x0) |= r1\n", {"atomic"}),
    ("r1 = *(u64 *)(r0 + 0x0)\n", {"read"}),
    ("*(u64 *)(r0 + 0x0) = 1\n", {"write"}),
    ("r3 = r0\nr1 = map[2] ll\nr2 = r3\nr3 = 8\nr4 = 0\ncall ringbuf_output\n", {"helper"}),
    ("r3 = r0\n*(u64 *)(r10 - 16) = 0\nr1 = r10\nr1 += -16\nr2 = 8\ncall trace_printk\n", {"address"}),
    ("r1 = r0\nr1 += 8\nr1 -= r0\n", {"address"}),
    ("r1 = r0\nr1 += 8\nif r1 != r0 goto +0\n", {"address"}),
    ("if r0 == r10 goto +0\n", {"address"}),
], ids=["add8", "add4", "fetch_add", "or", "read", "write", "helper_reads_it", "printed", "subtracted", "compared",
        "compared_with_stack"])
def test_the_verifier_records_how_a_map_value_is_used(body, uses):
    v = verify(assemble(FOUND + body + OUT), list(MAPS))
    assert v.value_uses[1] == frozenset(uses) and set(v.value_uses) <= {1, 2}   # 2: the ring, a helper's


@pytest.mark.parametrize("flags, uses", [(1, {}), (0, {1: frozenset({"helper"})})], ids=["noexist", "any"])
def test_an_array_update_uses_its_values_unless_it_cannot_create(flags, uses):
    """BPF_NOEXIST on an array changes no slot (every slot exists: -EEXIST), so it is no use of them."""
    zero = "\n".join(f"        *(u64 *)(r10 - {72 - 8 * k}) = 0" for k in range(8))   # arr's 64-byte value
    asm = f"""
        *(u32 *)(r10 - 4) = 0
{zero}
        r2 = r10
        r2 += -4
        r3 = r10
        r3 += -72
        r1 = map[1] ll
        r4 = {flags}
        call map_update_elem
        r0 = 0
        exit"""
    assert verify(assemble(asm), list(MAPS)).value_uses == uses


def test_global_data_adds_are_recorded_for_its_map():
    asm = "r1 = map_value[4] + 0x8 ll\nr2 = 1\nlock *(u64 *)(r1 + 0x0) += r2\nr0 = 0\nexit"
    assert verify(assemble(asm), list(MAPS)).value_uses == {4: frozenset({"add8"})}


def _object(tmp_path: Path, source: str) -> BpfObject:
    src = tmp_path / "p.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n' + source + '\nchar LICENSE[] SEC("license") = "GPL";\n')
    return load_object(compile_probe(src, tmp_path / "p.bpf.o"))


def _array(name: str, value: str, entries: int = 4) -> str:
    return (f"struct {{ __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, {entries}); __type(key, __u32);"
            f" __type(value, {value}); }} {name} SEC(\".maps\");\n")


def _stripes(obj: BpfObject) -> dict[str, int]:
    stripe_counters(obj)
    return {m.name: m.stripe for m in obj.maps}


def test_counters_only_added_to_are_striped_and_all_others_stay_one_copy(tmp_path):
    obj = _object(tmp_path, _array("hits", "__u64") + _array("small", "__u32") + _array("seen", "__u64")
                  + _array("slots", "__u64") + _array("mixed", "__u64") + _array("huge", "__u64", 1 << 14) + """
__u64 total;
__u64 weight = 3;
SEC("egpu/mem/*")
int on_mem(struct egpu_ctx *ctx)
{
	__u32 k = ctx->site & 3;
	__u64 *h = bpf_map_lookup_elem(&hits, &k), *s = bpf_map_lookup_elem(&seen, &k);
	__u64 *n = bpf_map_lookup_elem(&slots, &k), *x = bpf_map_lookup_elem(&mixed, &k);
	__u64 *g = bpf_map_lookup_elem(&huge, &k);
	__u32 *w = bpf_map_lookup_elem(&small, &k);

	if (!h || !s || !n || !x || !w || !g)
		return 0;
	__sync_fetch_and_add(h, ctx->size);
	__sync_fetch_and_add(w, 1);
	__sync_fetch_and_add(g, 1);
	__sync_fetch_and_add(&total, weight);
	if (*s == 0)
		__sync_fetch_and_add(s, 1);              /* read as well: one copy */
	if (__sync_fetch_and_add(n, 1) > 5)          /* the old value is used: one copy */
		return 1;
	__sync_fetch_and_add((__u32 *)x, 1);         /* adds of two widths: one copy */
	__sync_fetch_and_add(x, 1);
	return 0;
}""")
    assert _stripes(obj) == {"hits": 8, "small": 4, "seen": 0, "slots": 0, "mixed": 0, "huge": 0,
                             "p.bss": 8, "p.data": 0}
    assert (1 << 14) * 8 > STRIPE_ROW_MAX


def test_maps_a_launch_probe_uses_stay_one_copy(tmp_path):
    """Launch probes run on the host copy, which mapsync copies into row 0 of a region: never striped."""
    obj = _object(tmp_path, _array("gpu_only", "__u64") + _array("shared", "__u64") + """
static __always_inline void bump(void *map)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(map, &k);

	if (v)
		__sync_fetch_and_add(v, 1);
}
SEC("kprobe/*")
int on_entry(struct egpu_ctx *ctx) { bump(&gpu_only); bump(&shared); return 0; }
SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *ctx) { bump(&shared); return 0; }""")
    assert _stripes(obj) == {"gpu_only": 8, "shared": 0}


def test_the_examples_counters_are_striped(tmp_path):
    """count_add's update with BPF_NOEXIST on an array is no use of it, so hist_add's slots stripe."""
    root = Path(__file__).resolve().parent.parent
    obj = load_object(compile_probe(root / "examples" / "kernel_duration.bpf.c", tmp_path / "k.bpf.o"))
    stripes = _stripes(obj)
    arrays = [m.name for m in obj.maps if m.type == MAP_ARRAY and not m.readonly and m.name.startswith("hist")]
    assert arrays and all(stripes[name] == 8 for name in arrays), stripes


def test_a_striped_region_starts_in_row_0_and_reads_back_as_the_sum_of_its_rows():
    m = MapDef("c", MAP_ARRAY, 4, 12, 3, stripe=4)   # 4-byte lanes, slots padded to 16 bytes
    lay, ncpu = layout(m), 5
    assert (lay.kind, lay.stride, lay.cpu_stride, lay.spread) == ("percpu_array", 16, LINE, SPREAD)
    rows = ncpu * SPREAD
    state = MapsState([m])
    state[0].values[1][:] = struct.pack("<3I", 7, 0, 0xFFFFFFFF)
    img = bytearray(region_image(m, state[0], ncpu))
    assert len(img) == HEADER + rows * LINE and struct.unpack_from("<I", img, 0) == (rows,)
    assert img[HEADER + 16:HEADER + 28] == state[0].values[1] and not any(img[HEADER + LINE:])
    for row in range(rows):   # what each warp slot's adds leave in its row
        for slot in range(3):
            o = HEADER + row * LINE + slot * 16
            lanes = struct.unpack_from("<3I", img, o)
            struct.pack_into("<3I", img, o, *((v + row + slot + lane) & 0xFFFFFFFF for lane, v in enumerate(lanes)))
        img[HEADER + row * LINE + 12:HEADER + row * LINE + 16] = b"\xff" * 4   # padding is not a lane
    out = MapsState([m])
    apply_region(out, 0, bytes(img))
    adds = [[sum(row + slot + lane for row in range(rows)) for lane in range(3)] for slot in range(3)]
    assert [struct.unpack("<3I", v) for v in out[0].values] == [
        tuple(adds[0]), (7 + adds[1][0], adds[1][1], (0xFFFFFFFF + adds[1][2]) & 0xFFFFFFFF), tuple(adds[2])]


@pytest.mark.parametrize("entries, spread", [(1, SPREAD), (128, SPREAD), (256, 4), (512, 2), (1024, 1), (8192, 1)])
def test_rows_per_sm_shrink_as_rows_grow(entries, spread):
    """A striped ARRAY of 8-byte counters: 8 rows per SM while they fit SPREAD_BYTES, fewer after."""
    lay = layout(MapDef("c", MAP_ARRAY, 4, 8, entries, stripe=8))
    assert lay.spread == spread and lay.spread * lay.cpu_stride <= max(SPREAD_BYTES, lay.cpu_stride)
    assert lay.region_size(132) == HEADER + 132 * spread * lay.cpu_stride
    assert layout(MapDef("p", MAP_PERCPU_ARRAY, 4, 8, entries)).spread == 1   # per-SM values stay per SM


def test_striped_maps_are_found_through_this_sms_row_and_ptxas_takes_it(probe_obj, tmp_path):
    """count (a lookup) and globals (a .bss counter reached by address) in PTX that reads %smid, which
    ptxas assembles for sm_90."""
    import subprocess
    for name in ("count", "globals"):
        obj = load_object(probe_obj(name))
        text = probe_object_ptx(obj)
        assert any(m.stripe for m in obj.maps) and "%smid" in text and "%warpid" in text, name
        path = tmp_path / f"{name}.ptx"
        path.write_text(text)
        done = subprocess.run(["ptxas", "-arch=sm_90", "-c", str(path), "-o", str(tmp_path / f"{name}.o")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_a_swap_takes_a_region_over_only_when_both_probes_stripe_it_alike():
    from egpu_preload.runtime.live import same_map
    one = MapDef("c", MAP_ARRAY, 4, 8, 4)
    assert same_map(one, MapDef("c", MAP_ARRAY, 4, 8, 4))
    assert not same_map(one, MapDef("c", MAP_ARRAY, 4, 8, 4, stripe=8))
