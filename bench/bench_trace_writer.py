"""The trace writer alone, no GPU: ``python3 bench/bench_trace_writer.py OUT.json [RECORDS]`` (default 2^20).

examples/access_trace.bpf.c's records (80 bytes each with the ring header) handed to
output/tracefile.TraceWriter as the ring reader hands them over (numpy Blocks of PASS records, what one
pass takes from a 16 MiB ring) and written as Parquet and as Arrow IPC, three times
each, alternating; the best time of each, the MB/s of records it makes, the file's size, and a check
that the file reads back whole (every row, every address). Needs pyarrow, and the probe prebuilt by
scripts/gpu-prep.sh or clang."""

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


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    from egpu_preload.bpf.compile import compile_probe
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.output import tracefile
    from egpu_preload.runtime.ring_drain import Block
    n = int(sys.argv[2]) if len(sys.argv) == 3 else 1 << 20
    block = records(n)
    doc: dict = {"records": n, "record_bytes": RECORD_BYTES, "cpus": os.cpu_count(), "machine": platform.node(),
                 "python": platform.python_version(), "formats": {}}
    with tempfile.TemporaryDirectory() as tmp:
        prebuilt = Path(os.environ.get("EGPU_PREBUILT_PROBES", ROOT / ".gpubuild" / "probes")) / "access_trace.v3.bpf.o"
        obj = load_object(prebuilt if prebuilt.exists() else      # the GPU machine has no clang
                          compile_probe(ROOT / "examples/access_trace.bpf.c", Path(tmp) / "p.bpf.o"))
        lay = tracefile.record_layout(obj.btf, tracefile.record_struct(obj.btf))
        best = {f: float("inf") for f in FORMATS}
        for _ in range(3):
            for f in FORMATS:
                path = Path(tmp) / f"t{f}"
                t = time.perf_counter()
                w = tracefile.TraceWriter(path, [("events", lay)])
                for start in range(0, n, PASS):
                    w.add(0, [Block(block.cpus[start:start + PASS], block.rows[start:start + PASS])])
                w.close({"events": 0})
                best[f] = min(best[f], time.perf_counter() - t)
                back = tracefile.read(path).rows
                whole = back.num_rows == n and back.column("addr").to_pylist()[-1] == 0x7F0000000000 + 4 * (n - 1)
                doc["formats"][f.lstrip(".")] = {"seconds": round(best[f], 4),
                                                 "mb_per_s": round(n * RECORD_BYTES / best[f] / 1e6),
                                                 "file_bytes": path.stat().st_size, "read_back_whole": whole}
    for name, r in doc["formats"].items():
        print(f"{name:8s} {r['seconds']:.3f} s  {r['mb_per_s']} MB/s of records  {r['file_bytes']:,} bytes  "
              f"read back whole: {r['read_back_whole']}")
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
