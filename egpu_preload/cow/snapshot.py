"""The checkpoint directory: one file per allocation and per module global, manifest.json, and its seal.

manifest.json (FORMAT_VERSION 2)::

    {"version": 2, "pid": 4242, "argv": ["./app", "--n", "8"], "created": "2025-01-01T00:00:00Z",
     "process": "9f0c...",                                    # names the process that took it (rollback)
     "program": {"exe": "/path/app", "sha256": "..."},        # its executable (re-run; absent: not recorded)
     "allocations_made": 5,                                   # allocations the process had made at the cut
     "cut": [{"stream": 0, "seq": 17}, ...],                  # dag.Cut: last operation per stream
     "allocations": [{"index": 3, "address": 140..., "size": 4096, "kind": 1,
                      "file": "alloc-000003.bin", "sha256": "..."}, ...],
     "globals": [{"module": "...", "symbol": "g_table", "size": 64, "file": "global-0000.bin",
                  "sha256": "..."}, ...],
     "info": {...}}                                           # optional: how it was taken (live.py)

``program`` is /proc/self/exe of the process that took it (the interpreter, for a script) and the sha256 of
its contents: a re-run is put back only into the same executable (check_program), since a different program
or build may well make allocations of the same sizes and would be silently overwritten.
``index`` is the allocation's creation number (allocations.Allocation.seq), which is what restore
matches on, together with size and kind. The list is the whole cut: every allocation of a SAVED_KIND
(non-empty) numbered below ``allocations_made`` that was live then, and every global of every module
with PTX loaded then.
manifest.hmac holds the manifest's seal (seal.py: keyed, so neither another user nor an edit can make
a manifest, or data with its sha256 rewritten, pass).

The directory is 0700 and every file 0600 (never wider, whatever the umask): the files are copies of
device memory.
Writing is atomic: everything goes into ``DIR.tmp``, is fsynced, and the directory is renamed to DIR
last, so DIR is either absent or complete; a file the filesystem refuses (full, read-only) or one past the
job's file size limit (checked first: writing past it would end the job by SIGXFSZ) is a SnapshotError
naming it. Reading validates everything before anything is handed
out: a directory without a manifest or seal, a seal that does not match, bad JSON, another version,
entries that contradict each other, a missing or resized file, a wrong sha256, or files others may
write are refused with a SnapshotError naming DIR and the reason. ``plan_restore`` then matches the
snapshot against the live allocations and globals and refuses any mismatch (and, rolling back the
process that took it, any allocation of the cut that the manifest lacks, or that moved) before the
first byte is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from egpu_preload.cow import seal
from egpu_preload.cow.allocations import Allocation, AllocKind
from egpu_preload.cow.dag import Cut
from egpu_preload.errors import SnapshotError

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
SEAL = "manifest.hmac"
# What a checkpoint saves: device memory. Host memory is the process's own; a VMM handle is saved
# through its mappings.
SAVED_KINDS = (AllocKind.DEVICE, AllocKind.PITCH, AllocKind.MANAGED, AllocKind.ASYNC, AllocKind.VMM_MAPPING)
CHUNK = 64 << 20     # bytes read or hashed at a time

Data = bytes | bytearray | memoryview | Iterable[bytes | bytearray | memoryview]


def saved(alloc: Allocation) -> bool:
    """Whether a checkpoint saves ``alloc`` (and so a whole one lists it)."""
    return alloc.kind in SAVED_KINDS and alloc.size > 0


@dataclass(frozen=True)
class Job:
    """The process a rollback writes into: the checkpoint must be its own."""

    process: str
    pid: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Program:
    """The executable a checkpoint was taken of (/proc/self/exe), by path and by contents."""

    exe: str
    sha256: str


@dataclass(frozen=True)
class AllocEntry:
    index: int
    address: int
    size: int
    kind: int
    file: str
    sha256: str


@dataclass(frozen=True)
class GlobalEntry:
    module: str
    symbol: str
    size: int
    file: str
    sha256: str


@dataclass(frozen=True)
class Manifest:
    directory: Path
    pid: int
    argv: tuple[str, ...]
    created: str
    cut: Cut
    allocations: tuple[AllocEntry, ...]
    globals: tuple[GlobalEntry, ...]
    process: str = ""
    allocations_made: int = 0
    version: int = FORMAT_VERSION
    program: Program | None = None    # None: a checkpoint from before egpu recorded it
    info: dict[str, Any] = field(default_factory=dict, compare=False)   # not validated: a report
    # file -> (size, mtime_ns) as load() checked it; plan_restore refuses files changed since
    checked: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "pid": self.pid, "argv": list(self.argv), "created": self.created,
                "process": self.process, "allocations_made": self.allocations_made,
                "cut": [{"stream": s, "seq": q} for s, q in sorted(self.cut.items())],
                "allocations": [asdict(a) for a in self.allocations],
                "globals": [asdict(g) for g in self.globals], "info": self.info,
                **({"program": asdict(self.program)} if self.program else {})}


def _error(directory: Path | str, reason: str) -> SnapshotError:
    return SnapshotError(reason, file=str(directory))


class SnapshotWriter:
    """Build a checkpoint in DIR.tmp; ``commit`` renames it to DIR. As a context manager, an
    exception (or a missing commit) removes DIR.tmp and leaves no DIR."""

    def __init__(self, directory: Path | str, *, pid: int, argv: Iterable[str], cut: Cut,
                 process: str = "", program: Program | None = None) -> None:
        self.dir = Path(directory)
        self.tmp = self.dir.with_name(self.dir.name + ".tmp")
        if self.dir.exists():
            raise _error(self.dir, "already exists: a checkpoint is never overwritten")
        if self.tmp.exists():
            raise _error(self.dir, f"{self.tmp.name} exists (an interrupted checkpoint?): remove it first")
        try:
            self.tmp.parent.mkdir(parents=True, exist_ok=True)
            self.tmp.mkdir(mode=0o700)   # the umask may only narrow it
        except OSError as e:   # EACCES, EROFS, ENOSPC; EEXIST: a parent is a file (the tmp was checked above)
            why = "not a directory" if isinstance(e, FileExistsError) else e.strerror
            raise _error(self.dir, f"cannot create {e.filename}: {why}") from None
        self.pid, self.argv, self.cut, self.process, self.program = pid, tuple(argv), dict(cut), process, program
        self.allocations: dict[int, AllocEntry] = {}
        self.globals: dict[tuple[str, str], GlobalEntry] = {}
        self.info: dict[str, Any] = {}     # written into the manifest as it is at commit
        # allocations made when the cut was taken (the next one's number); None: one past the last added
        self.allocations_made: int | None = None
        self.done = False

    def __enter__(self) -> "SnapshotWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.done:
            self.abort()

    def add_allocation(self, alloc: Allocation, data: Data) -> AllocEntry:
        """Write one allocation's contents (bytes, or an iterable of chunks, ``alloc.size`` in all)."""
        if alloc.kind == AllocKind.VMM_HANDLE:
            raise _error(self.dir, f"allocation #{alloc.seq} is a VMM handle: snapshot its mapping")
        if alloc.seq in self.allocations:
            raise _error(self.dir, f"allocation #{alloc.seq} written twice")
        name = f"alloc-{alloc.seq:06d}.bin"
        digest = self._write(name, data, alloc.size, f"allocation #{alloc.seq}")
        entry = AllocEntry(alloc.seq, alloc.address, alloc.size, int(alloc.kind), name, digest)
        self.allocations[alloc.seq] = entry
        return entry

    def add_global(self, module: str, symbol: str, data: Data, size: int) -> GlobalEntry:
        """Write one module global's contents (``size`` bytes)."""
        if (module, symbol) in self.globals:
            raise _error(self.dir, f"global {symbol} of {module} written twice")
        name = f"global-{len(self.globals):04d}.bin"
        digest = self._write(name, data, size, f"global {symbol}")
        entry = GlobalEntry(module, symbol, size, name, digest)
        self.globals[(module, symbol)] = entry
        return entry

    def _write(self, name: str, data: Data, size: int, what: str) -> str:
        h, n = hashlib.sha256(), 0
        chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
        self._check_room(name, size)
        try:
            with _private_file(self.tmp / name) as f:
                for chunk in chunks:
                    f.write(chunk)
                    h.update(chunk)
                    n += memoryview(chunk).nbytes
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:   # ENOSPC, EDQUOT, EIO
            raise _error(self.dir, f"cannot write {name}: {e.strerror}") from None
        if n != size:
            raise _error(self.dir, f"{what}: {n} bytes given for {size}")
        return h.hexdigest()

    def _check_room(self, name: str, size: int) -> None:
        """Refuse a file past the file size limit (ulimit -f) before writing it: writing past it sends
        SIGXFSZ, which ends the job (the shim's interpreter leaves it at its default)."""
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and size > limit:
            raise _error(self.dir, f"{name}: {size} bytes, past the job's file size limit (ulimit -f) of "
                                   f"{limit} bytes")

    def commit(self) -> Manifest:
        """Write the manifest and its seal, and publish the directory (one rename)."""
        made = self.allocations_made
        if made is None:
            made = max(self.allocations, default=-1) + 1
        manifest = Manifest(self.dir, self.pid, self.argv,
                            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), self.cut,
                            tuple(self.allocations[i] for i in sorted(self.allocations)),
                            tuple(self.globals.values()), self.process, made, program=self.program,
                            info=dict(self.info))
        _check_whole(self.dir, manifest)
        text = json.dumps(manifest.to_json(), indent=1).encode()
        for name, data in ((MANIFEST, text), (SEAL, (seal.seal(text) + "\n").encode())):
            self._write(name, data, len(data), name)
        _fsync_dir(self.tmp)
        try:
            os.rename(self.tmp, self.dir)   # fails if DIR appeared meanwhile (non-empty) or on EXDEV
        except OSError as e:
            self.abort()
            raise _error(self.dir, f"cannot publish the checkpoint: {e.strerror}") from None
        _fsync_dir(self.dir.parent)
        self.done = True
        return manifest

    def abort(self) -> None:
        self.done = True
        shutil.rmtree(self.tmp, ignore_errors=True)


def _private_file(path: Path) -> Any:
    """A new file only this user may read (0600; the umask may only narrow it), open for writing."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(directory: Path | str, *, verify: bool = True) -> Manifest:
    """The manifest of a complete, intact checkpoint; SnapshotError otherwise. ``verify`` hashes
    every file (reads all the bytes); without it sizes are still checked."""
    d = Path(directory)
    if not d.is_dir():
        tmp = d.with_name(d.name + ".tmp")
        raise _error(d, f"an interrupted checkpoint ({tmp.name} was never completed)" if tmp.exists()
                     else "not a directory (a checkpoint is one)" if d.exists() else "no such checkpoint directory")
    for path in (d, d / MANIFEST, d / SEAL):
        _check_private(d, path)
    try:
        text = (d / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise _error(d, f"{MANIFEST} missing (not a checkpoint, or a partial one)") from None
    except OSError as e:
        raise _error(d, f"{MANIFEST}: cannot read: {e.strerror}") from None
    try:
        mac = (d / SEAL).read_text()
    except FileNotFoundError:
        raise _error(d, f"{SEAL} missing: the manifest is not sealed (made by an egpu older than "
                        f"format {FORMAT_VERSION}?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _error(d, f"{SEAL}: cannot read: {e}") from None
    if not seal.matches(text, mac):
        raise _error(d, f"{MANIFEST} does not match its seal ({SEAL}): edited since it was written, "
                        "or written by another user")
    try:
        raw = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _error(d, f"{MANIFEST} is not valid JSON: {e}") from None
    m = _parse(d, raw)
    _check_whole(d, m)
    for entry in list(m.allocations) + list(m.globals):
        m.checked[entry.file] = _check_file(d, entry, verify)
    return m


def _check_whole(d: Path, m: Manifest) -> None:
    """Entries that agree with each other: one file each, one entry per allocation and per global, only
    kinds a checkpoint saves, and every allocation below ``allocations_made``."""
    files = [e.file for e in m.allocations] + [g.file for g in m.globals]
    if len(set(files)) != len(files):
        raise _error(d, f"{MANIFEST}: two entries share a file")
    if len({e.index for e in m.allocations}) != len(m.allocations):
        raise _error(d, f"{MANIFEST}: two allocations share an index")
    if len({(g.module, g.symbol) for g in m.globals}) != len(m.globals):
        raise _error(d, f"{MANIFEST}: a global is listed twice")
    for e in m.allocations:
        if e.kind not in SAVED_KINDS:
            raise _error(d, f"{MANIFEST}: allocation #{e.index} is of kind {e.kind}, which no checkpoint saves")
        if not 0 <= e.index < m.allocations_made:
            raise _error(d, f"{MANIFEST}: allocation #{e.index} was not made by the cut "
                            f"({m.allocations_made} allocations)")


def _check_private(d: Path, path: Path) -> None:
    """Refuse what another user may write (or a file that is not one): a checkpoint is 0600 in 0700."""
    try:
        st = os.stat(path) if path == d else os.lstat(path)   # the directory may be a link of the user's
    except FileNotFoundError:
        return   # the callers say what is missing
    except OSError as e:   # EACCES: a directory without search permission
        raise _error(d, f"{'the directory' if path == d else path.name}: cannot read: {e.strerror}") from None
    if path != d and not stat.S_ISREG(st.st_mode):
        raise _error(d, f"{path.name} is not a plain file")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        name = "the directory" if path == d else path.name
        raise _error(d, f"{name} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: a checkpoint "
                        f"must be private to uid {os.geteuid()} (0600 files in a 0700 directory)")


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's contents, read a piece at a time (snapshot files and executables are large)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check_file(d: Path, entry: AllocEntry | GlobalEntry, verify: bool) -> tuple[int, int]:
    path = d / entry.file
    _check_private(d, path)
    try:
        st = path.stat()
        if st.st_size != entry.size:
            raise _error(d, f"{entry.file}: {st.st_size} bytes, the manifest says {entry.size}")
        if verify and file_sha256(path) != entry.sha256:
            raise _error(d, f"{entry.file}: sha256 mismatch (corrupt contents)")
    except FileNotFoundError:
        raise _error(d, f"{entry.file} missing") from None
    except OSError as e:   # EACCES, EIO: a file the restore could not read either
        raise _error(d, f"{entry.file}: cannot read: {e.strerror}") from None
    return st.st_size, st.st_mtime_ns


_ALLOC_FIELDS = {"index": int, "address": int, "size": int, "kind": int, "file": str, "sha256": str}
_GLOBAL_FIELDS = {"module": str, "symbol": str, "size": int, "file": str, "sha256": str}


def _parse(d: Path, raw: Any) -> Manifest:
    def need(obj: Any, key: str, typ: type, where: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise _error(d, f"{MANIFEST}: {where}{key} missing")
        v = obj[key]
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise _error(d, f"{MANIFEST}: {where}{key} is not {'an integer' if typ is int else 'a ' + typ.__name__}")
        return v

    version = need(raw, "version", int, "")
    if version != FORMAT_VERSION:
        raise _error(d, f"format version {version}; this egpu reads version {FORMAT_VERSION}")
    argv = need(raw, "argv", list, "")
    if not all(isinstance(a, str) for a in argv):
        raise _error(d, f"{MANIFEST}: argv is not a list of strings")
    cut = {need(c, "stream", int, f"cut[{i}]."): need(c, "seq", int, f"cut[{i}].")
           for i, c in enumerate(need(raw, "cut", list, ""))}
    allocs = tuple(AllocEntry(**{k: need(a, k, t, f"allocations[{i}].") for k, t in _ALLOC_FIELDS.items()})
                   for i, a in enumerate(need(raw, "allocations", list, "")))
    globs = tuple(GlobalEntry(**{k: need(g, k, t, f"globals[{i}].") for k, t in _GLOBAL_FIELDS.items()})
                  for i, g in enumerate(need(raw, "globals", list, "")))
    for e in allocs + globs:
        if e.file in ("", ".", "..", MANIFEST) or "/" in e.file or "\\" in e.file or "\0" in e.file:
            raise _error(d, f"{MANIFEST}: file name {e.file!r} is not a plain name inside the directory")
        if e.size < 0:
            raise _error(d, f"{MANIFEST}: {e.file} has a negative size")
    info = raw.get("info", {})
    if not isinstance(info, dict):
        raise _error(d, f"{MANIFEST}: info is not an object")
    program = raw.get("program")
    if program is not None:
        program = Program(**{k: need(program, k, str, "program.") for k in ("exe", "sha256")})
    return Manifest(d, need(raw, "pid", int, ""), tuple(argv), need(raw, "created", str, ""), cut,
                    allocs, globs, need(raw, "process", str, ""), need(raw, "allocations_made", int, ""),
                    version, program, info)


@dataclass(frozen=True)
class Copy:
    """One file's contents to put at one live address."""

    path: Path
    address: int
    size: int
    what: str          # "allocation #3", "global g_table of <module>"


@dataclass(frozen=True)
class RestorePlan:
    manifest: Manifest
    copies: tuple[Copy, ...]

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.copies)

    def execute(self, write: Callable[[int, memoryview], None], chunk: int = CHUNK) -> None:
        """Put every byte back: ``write(address, data)`` for consecutive pieces of each copy
        (cuMemcpyHtoD, or a plain memory write for host allocations)."""
        for c in self.copies:
            with open(c.path, "rb") as f:
                off = 0
                while piece := f.read(chunk):
                    write(c.address + off, memoryview(piece))
                    off += len(piece)


def plan_restore(manifest: Manifest, live: Iterable[Allocation],
                 live_globals: dict[tuple[str, str], tuple[int, int]] | None = None,
                 job: Job | None = None) -> RestorePlan:
    """Match the snapshot to the live allocations (by creation number, then size and kind) and module
    globals ((module, symbol) -> (address, size)); every live global of a module the snapshot has must be
    in it. Rolling back ``job`` (the process that took it, or a SnapshotError): every live allocation of
    the cut must be in it, at its address. SnapshotError on any mismatch, or if a file changed since
    ``load`` checked it. Nothing is written here.

    A re-run (``job`` None) is matched by creation number only: addresses may differ, and allocations the
    first run had freed by the cut may still be live when the restore fires."""
    d = manifest.directory
    live = list(live)
    by_seq = {a.seq: a for a in live}
    if job is not None:
        _check_job(manifest, job)
        listed = {e.index for e in manifest.allocations}
        for a in live:
            if saved(a) and a.seq < manifest.allocations_made and a.seq not in listed:
                raise _error(d, f"allocation #{a.seq} ({a.size} bytes of {a.kind.name}) was live at the cut but "
                                "is not in the checkpoint: a restore puts back all of the cut or nothing")
    copies = []
    for e in manifest.allocations:
        a = by_seq.get(e.index)
        if a is None:
            raise _error(d, f"allocation #{e.index} ({e.size} bytes) has not been recreated")
        if a.size != e.size or int(a.kind) != e.kind:
            raise _error(d, f"allocation #{e.index}: the checkpoint has {e.size} bytes of "
                            f"{AllocKind(e.kind).name}, the live one {a.size} bytes of {a.kind.name}")
        if job is not None and a.address != e.address:
            raise _error(d, f"allocation #{e.index}: the checkpoint has it at {e.address:#x}, the job at "
                            f"{a.address:#x}")
        copies.append(Copy(d / e.file, a.address, e.size, f"allocation #{e.index}"))
    live_globals = live_globals or {}
    modules = {g.module for g in manifest.globals}
    listed_globals = {(g.module, g.symbol) for g in manifest.globals}
    for module, symbol in sorted(live_globals):
        if module in modules and (module, symbol) not in listed_globals:
            raise _error(d, f"global {symbol} of module {module} is not in the checkpoint: a restore puts back "
                            "all of the cut or nothing")
    for g in manifest.globals:
        where = live_globals.get((g.module, g.symbol))
        if where is None:
            raise _error(d, f"global {g.symbol} of module {g.module} is not loaded")
        if where[1] != g.size:
            raise _error(d, f"global {g.symbol}: the checkpoint has {g.size} bytes, the live one {where[1]}")
        copies.append(Copy(d / g.file, where[0], g.size, f"global {g.symbol} of {g.module}"))
    for c in copies:
        try:
            st = c.path.stat()
        except FileNotFoundError:
            raise _error(d, f"{c.path.name} disappeared after the checkpoint was checked") from None
        if c.path.name not in manifest.checked:
            raise _error(d, f"{c.path.name} was never checked: restore from snapshot.load()")
        if manifest.checked[c.path.name] != (st.st_size, st.st_mtime_ns):
            raise _error(d, f"{c.path.name} changed after the checkpoint was checked: load it again")
    return RestorePlan(manifest, tuple(copies))


def check_program(m: Manifest, program: Program) -> None:
    """A re-run goes only into the executable the checkpoint was taken of, by contents (a copy elsewhere is
    the same program, a rebuild is not): another program, or another build, may make allocations of the
    same sizes, which plan_restore would overwrite without a word."""
    if m.program is None or m.program.sha256 == program.sha256:
        return
    what = "another build of it" if m.program.exe == program.exe else "another program"
    raise _error(m.directory, f"a checkpoint of {m.program.exe} (sha256 {m.program.sha256[:12]}), and this job runs "
                              f"{what}, {program.exe} (sha256 {program.sha256[:12]}); egpu-run "
                              "--restore-other-build puts it back all the same where the allocations match")


def _check_job(m: Manifest, job: Job) -> None:
    """A rollback goes only into the process that took the checkpoint (a re-run is egpu-run --restore)."""
    if (m.process, m.pid, m.argv) != (job.process, job.pid, job.argv):
        raise _error(m.directory, f"a checkpoint of process {m.pid} ({' '.join(m.argv)}), not of this one "
                                  f"({job.pid}): roll back only the process that took it; egpu-run --restore "
                                  "starts a new one from it")
