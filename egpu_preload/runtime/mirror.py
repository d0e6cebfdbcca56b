"""The maps of a running process in shared memory, for readers that ask the job nothing.

A thread of the runtime reads the attached probes' maps every ``period`` seconds (live.Live.maps: the
regions copied on a stream of the runtime's own, so no application stream waits) and writes the
document into ``<dir>/<pid>.maps`` beside the control socket (control.socket_dir: a private directory,
the file mode 0600). ``egpu maps PID --mirror`` reads it there; a job stuck in a kernel, or too busy to
answer its socket, still shows its maps as of the last copy.

Segment layout (little-endian), a seqlock around one msgpack document:

    0   8  magic  b"EGPUMAP1"
    8   4  u32 sequence: odd while the writer is inside, even otherwise
    12  4  u32 zero
    16  8  u64 payload length
    24  8  u64 when the payload was written (CLOCK_REALTIME ns)
    32  .  payload: the "maps" reply of the control socket (dump.py's document)

The writer maps the file and updates it in place; when a document does not fit it makes a file twice
the size and renames it over the old one (a reader that opened the old one reads a complete, older
document). A reader copies the file and retries while the sequence is odd or moved during the copy.

In a job of egpu-run, the first copy also leaves a symlink ``<session>/<pid>.maps`` to the segment: a
process killed before its exit dump (SIGTERM, SIGKILL) leaves its segment behind, and egpu-run finds
it there and prints its maps as of that copy (``left_behind``); so does one still running when the job's
main process ended (daemonized, orphaned), whose dump would come too late. An image that dumps before an exec
removes its segment: the next image's copies are its own.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from egpu_preload.control import process_exists, process_running, socket_path
from egpu_preload.descriptors import mapped, unmap
from egpu_preload.errors import EgpuError
from egpu_preload.runtime.dump import other_version

MAGIC = b"EGPUMAP1"
HEADER = struct.Struct("<8sIIQQ")
SEQ_AT = 8
MIN_SIZE = 1 << 16
RETRIES = 100


def mirror_path(pid: int, directory: Path | None = None) -> Path:
    """``<pid>.maps`` beside the process's control socket (control.socket_path: wherever its session lives)."""
    return socket_path(pid, directory).with_name(f"{pid}.maps")


class Segment:
    """The writer's side: one document at a time into the mapped file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seq = 0
        self._map: Any = None   # the mapping, a ctypes char array over it
        self._lock = threading.RLock()   # no unmapping under a write (a stop that gave up waiting for the thread)

    def write(self, payload: bytes) -> None:
        with self._lock:
            if self._map is None or HEADER.size + len(payload) > len(self._map):
                self._grow(max(MIN_SIZE, 2 * (HEADER.size + len(payload))))
            m = self._map
            struct.pack_into("<I", m, SEQ_AT, self.seq + 1)
            m[HEADER.size:HEADER.size + len(payload)] = payload
            struct.pack_into("<QQ", m, 16, len(payload), time.time_ns())
            self.seq += 2
            struct.pack_into("<I", m, SEQ_AT, self.seq)

    def _grow(self, size: int) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            new = mapped(fd, size)   # no descriptor held: a daemon's close of all of them closed the job's files
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        HEADER.pack_into(new, 0, MAGIC, self.seq + 1, 0, 0, 0)   # odd: the document follows (write)
        os.replace(tmp, self.path)
        self.close(unlink=False)
        self._map = new

    def close(self, unlink: bool = True) -> None:
        with self._lock:
            if self._map is not None:
                m, self._map = self._map, None
                unmap(m)
        if unlink:
            self.path.unlink(missing_ok=True)


class Mirror:
    """Writes ``read()`` (a document) into the segment every ``period`` seconds, on a daemon thread; after
    the first, a symlink to the segment in ``session`` (egpu-run's, when there is one)."""

    def __init__(self, read: Callable[[], dict | None], period: float, path: Path,
                 session: Path | None = None) -> None:
        # egpu-run --mirror inf (or 1e300): as good as never, within what a wait takes (it raised
        # OverflowError in the thread, a traceback in the job's stderr); stop() waits 5 periods, errors 10
        self.read, self.period = read, min(period, threading.TIMEOUT_MAX / 20)
        self.pid = os.getpid()   # the process that made it: only that one stops it (see stop)
        self.segment = Segment(path)
        self.link = session / path.name if session is not None else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="egpu-mirror", daemon=True)

    def start(self) -> "Mirror":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and remove the segment (a reader finds no stale maps of a process gone). In a
        child forked after the runtime started (after CUDA) there is neither thread nor segment of its own:
        no mirror is made there, since the driver refuses every call in such a child (a DataLoader worker's),
        and the maps its memory holds are its parent's, which would show a second time under its pid."""
        if self.pid != os.getpid():
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.period + 5)
        self.segment.close()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                doc = self.read()
                if doc is not None:
                    self.segment.write(msgpack.packb(doc, use_bin_type=True))
                    # no session (this process outlived egpu-run, which removed it): no one to tell
                    if self.link is not None and self.link.parent.is_dir():
                        self.link, link = None, self.link
                        link.unlink(missing_ok=True)   # a reused pid's, from an earlier process
                        link.symlink_to(self.segment.path)
            except (EgpuError, OSError) as e:   # the maps are unreadable now; the job runs on
                print(f"egpu[{os.getpid()}]: map mirror: {e}", file=sys.stderr)
                self._stop.wait(10 * self.period)


def start(read: Callable[[], dict | None], period: float, session: Path | None = None) -> Mirror | None:
    """Mirror ``read()`` (None: nothing to show yet) every ``period`` seconds, linked from egpu-run's
    ``session``; None when period is 0, or when this user has no private directory for it
    (control.socket_dir; one line says so)."""
    if period <= 0:
        return None
    try:
        return Mirror(read, period, mirror_path(os.getpid()), session).start()
    except EgpuError as e:
        print(f"egpu[{os.getpid()}]: no map mirror: {e}", file=sys.stderr)
        return None


def read_mirror(pid: int, directory: Path | None = None) -> tuple[dict, float]:
    """The document a process last mirrored and when (CLOCK_REALTIME seconds); EgpuError naming the
    file when there is none or it never settles."""
    path = mirror_path(pid, directory)
    if path.exists() and not process_exists(pid):
        path.unlink(missing_ok=True)
        raise EgpuError(f"process {pid} is not running (its stale map mirror was removed)", file=str(path))
    doc, when = read_segment(path)
    why = other_version(doc)
    if why is not None:
        raise EgpuError(f"not a map mirror this egpu reads ({why})", file=str(path))
    return doc, when


def left_behind(session: Path, dumped: set[int]) -> list[tuple[dict, float, bool]]:
    """(document, when copied, still running) of every process of egpu-run's ``session`` that mirrored its
    maps and made no dump (pid not in ``dumped``): killed, or still running. The segments of those gone are
    removed once read."""
    found = []
    for link in sorted(session.glob("*.maps")):
        pid = int(link.stem) if link.stem.isdigit() else None
        if pid is None or pid in dumped or not link.exists():
            continue
        running = process_running(pid)
        try:
            doc, when = read_segment(link)
        except EgpuError:   # half made when it was killed: no copy to show
            continue
        finally:
            if not running:
                link.resolve().unlink(missing_ok=True)
        found.append((doc, when, running))
    return found


def read_segment(path: Path) -> tuple[dict, float]:
    """read_mirror's document and time, from the segment at ``path``."""
    for _ in range(RETRIES):
        try:
            with open(path, "rb") as f:
                data = f.read()
                f.seek(SEQ_AT)
                after = f.read(4)
        except (FileNotFoundError, NotADirectoryError):   # $XDG_RUNTIME_DIR a file: no mirror there either
            raise EgpuError("no map mirror: the process has no egpu runtime, has loaded no probe yet, "
                            "or mirrors nothing (EGPU_MIRROR=0)", file=str(path)) from None
        except OSError as e:
            raise EgpuError(e.strerror or str(e), file=str(path)) from None
        if len(data) < HEADER.size:
            raise EgpuError("not a map mirror (too short)", file=str(path))
        magic, seq, _, length, written = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise EgpuError("not a map mirror (bad magic)", file=str(path))
        if seq % 2 or after != data[SEQ_AT:SEQ_AT + 4]:
            time.sleep(0.001)
            continue
        if seq == 0:
            raise EgpuError("the map mirror has no document yet", file=str(path))
        try:
            doc = msgpack.unpackb(data[HEADER.size:HEADER.size + length], raw=False)
        except ValueError as e:
            raise EgpuError(f"corrupt map mirror: {e}", file=str(path)) from None
        return doc, written / 1e9
    raise EgpuError("the map mirror did not settle (a writer inside on every read)", file=str(path))
