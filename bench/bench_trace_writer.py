"""The trace writer alone, no GPU: ``python3 bench/bench_trace_writer.py OUT.json [RECORDS]`` (default 2^20).

Two record streams, each 80 bytes a record with the ring header, handed to output/tracefile.TraceWriter as the
ring reader hands them over (numpy Blocks of PASS records, what one pass takes from a 16 MiB ring) and written as
Parquet and as Arrow IPC, three times each, alternating; the best time of each, the MB/s of records it makes, the
best CPU time of the process (pyarrow's threads' included; steadier than the time on a shared machine, whose
1-minute load average at the start is kept too), the file's size, and a check that the file reads back whole (every
row, the last record as made):

- ``formats``: examples/access_trace.bpf.c's records, a column per field, every field but ts and addr zero;
- ``warp.formats``: mem_trace_warp.bpf.c's affine warp records (struct egpu_warp_mem) as vecadd makes them,
  kept whole in ``data``, with their fields varying as there: zstd, which most of the writer's time goes to,
  runs faster over constant bytes.

Needs pyarrow, and the probe prebuilt by scripts/gpu-prep.sh or clang."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECORD_BYTES = 80
FORMATS = (".parquet", ".arrow")
PASS = (16 << 20) // RECORD_BYTES   # records one reader pass takes from examples/access_trace.bpf.c's ring


def records(n: int):
    """n access records as the reader's Block: SM ids and the struct rows (ts, addr rising)."""
    import numpy as np
    from egpu_preload.runtime.ring_drain import Block
    rows = np.zeros((n, RECORD_BYTES - 8), np.uint8)
    words = rows.view(np.uint64)
    words[:, 0] = 1_000_000 + 10 * np.arange(n, dtype=np.uint64)
    words[:, 1] = 0x7F0000000000 + 4 * np.arange(n, dtype=np.uint64)
    return Block((np.arange(n) % 132).astype(np.uint32), rows)


def warp_records(n: int):
    """n affine warp records as the reader's Block: vecadd's three a warp (a[i], b[i] loaded, c[i] stored) of
    blocks of 256 threads, their warps in the ring in the order SMs ran them (shuffled 4,096 at a time), ts rising."""
    import numpy as np
    from egpu_preload.output import warp_records as wr
    from egpu_preload.runtime.ring_drain import Block
    rng = np.random.default_rng(7)
    order = np.concatenate([start + rng.permutation(min(4096, n - start)) for start in range(0, n, 4096)])
    warp, site = order // 3, order % 3
    sm = (warp // 8 % 132).astype(np.uint32)
    r = np.zeros(n, wr._header_dtype(np))
    r["ts"] = 1_000_000 + np.cumsum(rng.integers(0, 6, n))
    r["base"] = 0x7F0000000000 + (site.astype(np.uint64) << 30) + 128 * warp.astype(np.uint64)
    r["kernel_id"], r["launch_id"], r["stride"], r["site"], r["mask"] = 1, 1, 4, site, 0xFFFFFFFF
    r["block"][:, 0], r["block_dim"], r["warp"], r["sm"] = warp // 8, (256, 1), warp % 8, sm
    r["size"], r["flags"], r["form"] = 4, site == 2, wr.FORM_AFFINE
    return Block(sm, r.view(np.uint8).reshape(n, wr.HEADER.size))


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    from egpu_preload.bpf.compile import compile_probe
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.output import tracefile, warp_records as wr
    from egpu_preload.runtime.ring_drain import Block
    n = int(sys.argv[2]) if len(sys.argv) == 3 else 1 << 20
    blocks = {"access": records(n), "warp": warp_records(n)}
    doc: dict = {"records": n, "record_bytes": RECORD_BYTES, "cpus": os.cpu_count(), "machine": platform.node(),
                 "python": platform.python_version(), "load_average": os.getloadavg()[0],
                 "formats": {}, "warp": {"formats": {}}}
    with tempfile.TemporaryDirectory() as tmp:
        prebuilt = Path(os.environ.get("EGPU_PREBUILT_PROBES", ROOT / ".gpubuild" / "probes")) / "access_trace.v3.bpf.o"
        obj = load_object(prebuilt if prebuilt.exists() else      # the GPU machine has no clang
                          compile_probe(ROOT / "examples/access_trace.bpf.c", Path(tmp) / "p.bpf.o"))
        layouts = {"access": tracefile.record_layout(obj.btf, tracefile.record_struct(obj.btf)),
                   "warp": tracefile.whole_records(wr.RECORD_TYPE)}
        best = {(s, f): float("inf") for s in blocks for f in FORMATS}
        cpu = dict(best)
        for _ in range(3):
            for (stream, f), seconds in best.items():
                block, path = blocks[stream], Path(tmp) / f"t{f}"
                t, c = time.perf_counter(), time.process_time()
                w = tracefile.TraceWriter(path, [("events", layouts[stream])])
                for start in range(0, n, PASS):
                    w.add(0, [Block(block.cpus[start:start + PASS], block.rows[start:start + PASS])])
                w.close({"events": 0})
                best[stream, f] = min(seconds, time.perf_counter() - t)
                cpu[stream, f] = min(cpu[stream, f], time.process_time() - c)
                back = tracefile.read(path, {}).rows   # warp records as written, not expanded
                last = (back.column("addr")[-1].as_py() == 0x7F0000000000 + 4 * (n - 1) if stream == "access" else
                        back.column("data")[-1].as_py() == block.rows[-1].tobytes())
                (doc if stream == "access" else doc["warp"])["formats"][f.lstrip(".")] = {
                    "seconds": round(best[stream, f], 4), "mb_per_s": round(n * RECORD_BYTES / best[stream, f] / 1e6),
                    "cpu_seconds": round(cpu[stream, f], 4), "file_bytes": path.stat().st_size,
                    "read_back_whole": back.num_rows == n and last}
    for stream, formats in (("access", doc["formats"]), ("warp", doc["warp"]["formats"])):
        for name, r in formats.items():
            print(f"{stream:6s} {name:8s} {r['seconds']:.3f} s  {r['mb_per_s']} MB/s of records  "
                  f"{r['cpu_seconds']:.3f} s of CPU  {r['file_bytes']:,} bytes  whole: {r['read_back_whole']}")
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
