"""Which tree a GPU result came from, read on the GPU machine from the files that ran there.

The device receives the working tree's files, not .git, so it cannot ask git which commit it runs.
Here (``provenance.py manifest``, from scripts/gpu-prep.sh) the commit and every tracked file's blob id
at that commit (``git ls-tree -r HEAD``) go into .gpubuild/TREE, with the untracked files git does not
ignore (they travel too). There (``provenance.py stamp``, ``provenance.py annotate JSON``) each of those
files is hashed as git hashes a blob and compared: the tree is clean only when every tracked file is
there with its commit's content and no untracked file travelled. A file added after gpu-prep.sh ran
and not ignored cannot be seen there (no list of what travelled); run gpu-prep.sh right before a call.

Every committed result JSON carries ``stamp``'s record: commit, dirty, the files that differ, the GPU,
its driver, the time, and the log its run printed (scripts/gpu-test.sh writes it beside the JSON).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".gpubuild" / "TREE"
LOG = "gpu-test.log"  # scripts/gpu-test.sh's log, in the same folder as the result JSONs
SHOWN = 20            # changed files named in a stamp; the count says how many in all


def blob_id(path: Path) -> str:
    """The id git gives the file's content (a symlink: its target), as `git hash-object` would."""
    data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def manifest(root: Path) -> dict[str, Any]:
    """Here, with git: HEAD, its files' blob ids, and the untracked files that travel with the tree."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    blobs = {}
    for line in git("ls-tree", "-r", "-z", "HEAD").split("\0"):
        if line:
            meta, path = line.split("\t", 1)
            mode, kind, oid = meta.split()
            if kind == "blob":
                blobs[path] = oid
    untracked = [p for p in git("ls-files", "-z", "--others", "--exclude-standard").split("\0") if p]
    return {"commit": git("rev-parse", "HEAD").strip(), "blobs": blobs, "untracked": untracked}


def verify(root: Path, tree: dict[str, Any]) -> dict[str, Any]:
    """On the device: the manifest's commit, and whether the files here are exactly its tree."""
    changed = [p for p, oid in sorted(tree["blobs"].items())
               if not ((root / p).is_file() or (root / p).is_symlink()) or blob_id(root / p) != oid]
    extra = [p for p in tree["untracked"] if (root / p).exists()]
    out: dict[str, Any] = {"commit": tree["commit"], "dirty": bool(changed or extra)}
    if changed or extra:
        out["differs"] = {"count": len(changed) + len(extra), "files": (changed + extra)[:SHOWN]}
    return out


def gpu() -> dict[str, str]:
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return {"gpu": "", "driver": ""}
    name, _, driver = line.partition(", ")
    return {"gpu": name, "driver": driver}


def stamp(root: Path = ROOT, log: str = LOG) -> dict[str, Any]:
    """The record a result carries; commit "unknown" and dirty true without a manifest."""
    manifest_file = root / TREE.relative_to(ROOT)
    if manifest_file.is_file():
        tree = verify(root, json.loads(manifest_file.read_text()))
    else:
        tree = {"commit": "unknown", "dirty": True, "differs": {"count": 0, "files": [],
                                                                "why": "no .gpubuild/TREE: run scripts/gpu-prep.sh"}}
    return {**tree, **gpu(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "log": log}


def annotate(path: Path, record: dict[str, Any]) -> None:
    """Put ``record`` into the result JSON at ``path`` as its "provenance"; a result that is not a JSON
    object gets one line on stderr and stays as it is."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"{path}: not annotated: {e}", file=sys.stderr)
        return
    if not isinstance(doc, dict):
        print(f"{path}: not annotated: not a JSON object", file=sys.stderr)
        return
    doc["provenance"] = record
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str]) -> int:
    usage = "usage: provenance.py manifest | stamp | annotate RESULT.json..."
    if not argv or argv[0] not in ("manifest", "stamp", "annotate"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "manifest":
        TREE.parent.mkdir(parents=True, exist_ok=True)
        TREE.write_text(json.dumps(manifest(ROOT)) + "\n")
    elif argv[0] == "stamp":
        print(json.dumps(stamp()))
    else:
        record = stamp()
        for name in argv[1:]:
            annotate(Path(name), record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
