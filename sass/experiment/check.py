"""Checks one run of run.sh: the tool's result file against the program's EXPECT lines, and the program's
HASH lines against a run without the tool. Prints RESULT PASS/FAIL/INFO lines; exit status 1 on any FAIL.

usage: check.py target|ebpf|torch ARRANGEMENT TOOL_OUT PROGRAM_STDOUT BASELINE_STDOUT"""
from __future__ import annotations

import re
import sys

fails = 0


def result(kind: str, name: str, detail: str) -> None:
    global fails
    fails += kind == "FAIL"
    print(f"RESULT {kind} {name}: {detail}", flush=True)


def kv(line: str) -> dict[str, str]:
    head, _, name = line.partition(" name=")
    d = dict(t.split("=", 1) for t in head.split()[1:] if "=" in t)
    if name:
        d["name"] = name.strip()
    return d


def num(d: dict[str, str], k: str) -> int:
    return int(d[k])


def read(path: str) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError as e:
        return [f"(unreadable: {e})"]


def threads(rec: dict[str, str]) -> tuple[int, int]:
    gx, gy, gz = map(int, rec["grid"].split(","))
    bx, by, bz = map(int, rec["block"].split(","))
    blocks = gx * gy * gz
    return blocks * bx * by * bz, blocks


def semantics(rec: dict[str, str]) -> str:
    t, b = threads(rec)
    e = num(rec, "enter")
    return "per-thread" if e == t else "per-block" if e == b else f"neither (enter={e} threads={t} blocks={b})"


def common(arr: str, tool: list[str], prog: list[str], base: list[str]) -> list[dict[str, str]]:
    for line in tool:
        if line.startswith(("apierr", "api ", "start", "summary", "context")):
            print(f"  tool: {line}")
    launches = [kv(l) for l in tool if l.startswith("launch ")]
    summary = [l for l in tool if l.startswith("summary")]
    if not tool or not any(l.startswith("start") for l in tool):
        result("FAIL", f"{arr}/started", "the tool never started (no 'start' line): not loaded or not initialised")
    elif not launches:
        result("FAIL", f"{arr}/launches", "the tool saw no launch (launch callbacks did not arrive)")
    else:
        result("PASS", f"{arr}/launches", f"{len(launches)} launches seen; {summary[-1] if summary else 'no summary'}")
    h, hb = [l for l in prog if l.startswith("HASH")], [l for l in base if l.startswith("HASH")]
    if h and h == hb:
        result("PASS", f"{arr}/outputs", f"bit-identical to the run without the tool ({len(h)} HASH lines)")
    else:
        result("FAIL", f"{arr}/outputs", f"with tool {h} vs without {hb}")
    return launches


def check_kernels(arr: str, launches: list[dict[str, str]], prog: list[str], ebpf: bool) -> None:
    for exp in (kv(l) for l in prog if l.startswith("EXPECT kernel=")):
        k = exp["kernel"]
        recs = [r for r in launches if k in r.get("name", "")]
        tag = f"{arr}/{k}"
        if len(recs) != int(exp["launches"]):
            result("FAIL", f"{tag}/launches", f"{len(recs)} records, expected {exp['launches']}")
            continue
        sem = {semantics(r) for r in recs}
        kind = "PASS" if len(sem) == 1 and next(iter(sem)).startswith("per-") else "FAIL"
        r0 = recs[0]
        result(kind, f"{tag}/block_enter", f"{sem} (enter={r0['enter']} groups={r0['groups']} tid0={r0['tid0']} "
               f"exit={r0['exit']} threads={exp['threads']} blocks={exp['blocks']} warps={exp['warps']})")
        ex = all(num(r, "exit") == num(r, "enter") for r in recs)
        result("PASS" if ex else "FAIL", f"{tag}/block_exit", f"exit == enter in every launch: {ex}")
        for field in ("loads", "stores", "ldbytes", "stbytes"):
            got = [num(r, field) for r in recs]
            want = int(exp[field])
            result("PASS" if all(g == want for g in got) else "FAIL", f"{tag}/{field}", f"got {got}, expected {want}")
        result("INFO", f"{tag}/flags", f"flag histogram (flags&15:count) {r0['flags']}; atomics={r0['atomics']} "
               f"other={r0['other']}")
        if ebpf:
            good = all(num(r, "map0") == num(r, "enter") == num(r, "probe") for r in recs)
            result("PASS" if good else "FAIL", f"{tag}/ebpf_count",
                   f"egpu count probe's map value == block-enter calls in every launch: "
                   f"{[(r['map0'], r['enter'], r['probe']) for r in recs]}")


def check_torch(arr: str, tool: list[str], launches: list[dict[str, str]], prog: list[str]) -> None:
    # Group launches by the mark before them.
    ops: dict[str, list[dict[str, str]]] = {}
    cur = None
    for line in tool:
        if line.startswith("mark "):
            cur = line[5:].strip()
            ops.setdefault(cur, [])
        elif line.startswith("launch ") and cur:
            ops[cur].append(kv(line))
    if not ops:
        result("FAIL", f"{arr}/marks", "no mark lines: sass_tool_mark did not reach the tool's copy of the library")
        return
    sems = [semantics(r) for r in launches]
    exact = sum(s == "per-thread" for s in sems)
    result("PASS" if launches and exact == len(launches) else "FAIL", f"{arr}/entry_exact",
           f"{exact}/{len(launches)} launches have block-enter calls == launched threads "
           f"(others: {[s for s in sems if s != 'per-thread'][:5]})")
    for exp in (kv(l) for l in prog if l.startswith("EXPECT op=")):
        recs = ops.get(exp["op"], [])
        tag = f"{arr}/{exp['op']}"
        if len(recs) != int(exp["launches"]):
            result("FAIL", tag, f"{len(recs)} launches between marks, expected {exp['launches']}: "
                   f"{[r.get('name', '?')[:80] for r in recs]}")
            continue
        r = recs[0]
        good = num(r, "ldbytes") == int(exp["ldbytes"]) and num(r, "stbytes") == int(exp["stbytes"])
        result("PASS" if good else "FAIL", f"{tag}/bytes", f"ldbytes={r['ldbytes']} stbytes={r['stbytes']} "
               f"(expected {exp['ldbytes']} / {exp['stbytes']}; loads={r['loads']} stores={r['stores']}) "
               f"{r['name'][:100]}")
    for op, recs in ops.items():
        for r in recs:
            result("INFO", f"{arr}/{op}", f"grid={r['grid']} block={r['block']} enter={r['enter']} exit={r['exit']} "
                   f"loads={r['loads']} stores={r['stores']} atomics={r['atomics']} ldbytes={r['ldbytes']} "
                   f"stbytes={r['stbytes']} flags={r['flags']} {r.get('name', '?')[:120]}")


def main() -> int:
    if len(sys.argv) != 6 or sys.argv[1] not in ("target", "ebpf", "torch"):
        print(__doc__)
        return 2
    what, arr, tool_path, prog_path, base_path = sys.argv[1:]
    tool, prog, base = read(tool_path), read(prog_path), read(base_path)
    launches = common(arr, tool, prog, base)
    if what == "torch":
        check_torch(arr, tool, launches, prog)
    else:
        v = [l for l in prog if l.startswith("VERIFY")]
        result("PASS" if v and "ok" in v[0] else "FAIL", f"{arr}/verify", v[0] if v else "no VERIFY line")
        check_kernels(arr, launches, prog, what == "ebpf")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
