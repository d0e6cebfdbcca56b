"""The control protocol: how ``egpu attach/detach/swap/maps/modules/ps`` talk to a running process.

One unix socket per process, ``<dir>/<pid>.sock`` (mode 0600) in a private directory (0700, ours):
``$XDG_RUNTIME_DIR/egpu``, else ``/tmp/egpu-<uid>``. Only the same uid (or root) may talk to it: the
directory's mode says so and the server checks the peer's SO_PEERCRED as well. Where another user made
that directory first (or a symlink there), sessions go to a private ``<tmp>/egpu-<uid>-XXXXXX`` made
by mkdtemp instead (``socket_dir``), and clients look in every such directory that is ours and private
(``socket_dirs``): a squatter can delay nothing and read nothing.

Frames are a 4-byte big-endian length, then a msgpack map of at most MAX_FRAME bytes:

    request  {"v": 1, "id": int, "cmd": str, ...fields of the command (COMMANDS)}
    reply    {"v": 1, "id": int | None, "ok": bool, "result": object}   or   {..., "ok": false, "error": str}

Every request is checked against COMMANDS before a handler sees it: types, required fields, no extra
fields. A bad request gets an error reply and the connection stays usable; a frame over the limit gets
an error reply and the connection is closed (its bytes cannot be skipped safely).

The server accepts in a daemon thread and serves every connection in a thread of its own, at most
MAX_CONNECTIONS at once: one more gets a "busy" error reply and is closed. A frame must arrive whole
within FRAME_TIMEOUT of the server starting to wait for it, and a reply must be taken within as long,
so an idle or slow client only ever holds its own connection, and that only for a while. Commands that
change the process (EXCLUSIVE) run one at a time, as they always did; the others run beside them
(handlers that read shared state take their own locks: runtime/live.py's Live.lock). A handler's
EgpuError becomes the error reply, any other exception an "internal error" reply, so the process never
sees them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import selectors
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import msgpack

from .descriptors import high, identity
from .errors import EgpuError

VERSION = 1
MAX_FRAME = 16 << 20        # 16 MiB: a probe object is a few KiB to a few MiB
FRAME_TIMEOUT = 5.0         # seconds within which a whole frame must arrive (or a reply be taken)
MAX_CONNECTIONS = 32        # served at once; one more is told "busy" and closed
BUSY_RETRY_S = 0.05         # between a client's connects while the listen queue is full
BUSY_WAIT_S = 2.0           # how long a client tries to connect to a full queue before it says "busy"
STOPPED_WAIT_S = 5.0        # how long a client waits for a reply from a process seen stopped all along
STOP_POLL_S = 0.5           # how often a client waiting for a reply looks whether its process is stopped
_LEN = struct.Struct(">I")
_UCRED = struct.Struct("iII")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (socket(7) SO_PEERCRED)
_SUN_PATH_MAX = 107         # sizeof(sockaddr_un.sun_path) - 1 (unix(7))


@dataclass(frozen=True)
class Field:
    type: type
    required: bool = True


# Command -> its fields beside v/id/cmd. bytes fields carry whole .bpf.o files.
COMMANDS: dict[str, dict[str, Field]] = {
    "ping": {},
    "attach": {"probe": Field(bytes), "name": Field(str)},
    "detach": {"name": Field(str, required=False)},
    "swap": {"old": Field(str), "new_probe": Field(bytes), "new_name": Field(str)},
    "maps": {},
    "modules": {},
    "checkpoint": {"dir": Field(str), "stop_the_world": Field(bool, required=False)},
    "restore": {"dir": Field(str)},
}

# Commands that change the process: the server runs them one at a time (a checkpoint must not meet a swap).
EXCLUSIVE = frozenset({"attach", "detach", "swap", "checkpoint", "restore"})
# The GIL's switch interval while a request is served. Handlers call the driver through cffi, which
# lets the GIL go at every call, and a training loop's thread keeps it for the whole interval (5 ms by
# default) each time the handler asks for it back: on the H200 an attach's few dozen driver calls took
# 70-330 ms that way, and a maps request holding Live.lock delays a detach as long. At 0.1 ms the
# handler waits that long per call instead.
HANDOFF_S = 1e-4

Handler = Callable[[dict], object]


class ControlError(EgpuError):
    """A control request that could not be made or was refused."""


class NoSession(ControlError):
    """No live egpu session behind a pid (no socket, or nobody listening on it)."""


class ControlTimeout(ControlError):
    """The session did not answer in time."""


class ControlBusy(ControlError):
    """The session serves as many connections as it may, or its listen queue is full."""


@dataclass(frozen=True)
class SessionInfo:
    pid: int
    path: Path
    info: dict | None  # the ping reply; None when the session is alive but did not answer in time


# --- where sockets live ---------------------------------------------------------------------------

def preferred_dir() -> Path:
    """``$XDG_RUNTIME_DIR/egpu`` when XDG_RUNTIME_DIR is set, else ``/tmp/egpu-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "egpu" if runtime else Path(f"/tmp/egpu-{os.getuid()}")


def _fallback_dirs() -> list[Path]:
    """The private ``<tmp>/egpu-<uid>-*`` directories of this user, oldest first (a squatter's are skipped)."""
    found = []
    for d in Path(tempfile.gettempdir()).glob(f"egpu-{os.getuid()}-*"):
        try:
            check_private_dir(d, create=False)
            found.append((os.lstat(d).st_mtime_ns, d))
        except (ControlError, OSError):
            continue
    return [d for _, d in sorted(found)]


def socket_dir(*, create: bool = False) -> Path:
    """The directory this user's sessions live in: the preferred one when it is private (or absent), else
    the oldest private fallback; ``create`` makes it (0700), or a fresh fallback (mkdtemp, one line on
    stderr) when the preferred one is not private. Never fails for another user's directory."""
    preferred = preferred_dir()
    try:
        check_private_dir(preferred, create=create)
        return preferred
    except ControlError as e:
        fallbacks = _fallback_dirs()
        if fallbacks:
            return fallbacks[0]
        if not create:
            raise
        fresh = Path(tempfile.mkdtemp(prefix=f"egpu-{os.getuid()}-"))
        print(f"egpu: {e}: using {fresh} instead", file=sys.stderr)
        return fresh


def socket_dirs() -> list[Path]:
    """Every directory a session of this user may live in (socket_dir's choices): the preferred one
    when it is private, then the fallbacks."""
    try:
        preferred = [preferred_dir()] if check_private_dir(preferred_dir(), create=False) else []
    except ControlError:
        preferred = []
    return preferred + _fallback_dirs()


def socket_path(pid: int, directory: Path | None = None) -> Path:
    """Where process ``pid``'s socket is: in ``directory``, else the first of socket_dirs() that has
    it (socket_dir() when none has)."""
    if directory is None:
        found = [d / f"{pid}.sock" for d in socket_dirs() if (d / f"{pid}.sock").exists()]
        return found[0] if found else socket_dir() / f"{pid}.sock"
    return directory / f"{pid}.sock"


def check_private_dir(directory: Path, *, create: bool) -> bool:
    """Make sure ``directory`` is ours and closed to others (creating it 0700 when asked); False when it
    does not exist and was not created. Anything else there (a symlink, another owner, group or other
    access), or a directory that cannot be made, is a ControlError: in /tmp another user could have made
    it first."""
    if create:
        try:
            directory.mkdir(mode=0o700, parents=False)
        except FileExistsError:
            pass
        except FileNotFoundError:  # $XDG_RUNTIME_DIR itself is missing
            try:
                directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                directory.mkdir(mode=0o700, exist_ok=True)
            except OSError as e:   # /proc/1: no directory can be made there
                raise ControlError(f"{directory}: cannot create it ({e.strerror})") from None
        except OSError as e:   # $XDG_RUNTIME_DIR a file, or read-only: a traceback, and the job never ran
            raise ControlError(f"{directory}: cannot create it ({e.strerror})") from None
    try:
        st = os.lstat(directory)
    except (FileNotFoundError, NotADirectoryError):   # under a file there is nothing
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"{directory}: not a directory (a symlink, or a file): refusing to use it")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ControlError(f"{directory}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}; "
                           f"egpu needs a directory private to uid {os.geteuid()} there")
    return True


def peer_allowed(peer_uid: int, own_uid: int) -> bool:
    """Only the process's own user, or root (who could ptrace it anyway), may control it."""
    return peer_uid == own_uid or peer_uid == 0


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected unix socket."""
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


# --- frames and messages --------------------------------------------------------------------------

def encode_frame(message: Mapping) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise ControlError(f"message of {len(body)} bytes exceeds the {MAX_FRAME >> 20} MiB frame limit")
    return _LEN.pack(len(body)) + body


class _FrameTooLarge(Exception):
    def __init__(self, size: int) -> None:
        self.size = size


def read_frame(sock: socket.socket, deadline: float | None = None) -> bytes | None:
    """One frame's body; None at a clean end of stream. Raises _FrameTooLarge before reading an
    oversized body, ConnectionError when the stream ends inside a frame, TimeoutError when the whole
    frame has not arrived by ``deadline`` (time.monotonic(); None: the socket's own timeout per read)."""
    header = _recv_exact(sock, _LEN.size, deadline, eof_ok=True)
    if header is None:
        return None
    size, = _LEN.unpack(header)
    if size > MAX_FRAME:
        raise _FrameTooLarge(size)
    return _recv_exact(sock, size, deadline, eof_ok=False)


def _remaining(sock: socket.socket, deadline: float | None) -> None:
    """Let the next blocking call on ``sock`` last no longer than until ``deadline``."""
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    sock.settimeout(left)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None, *, eof_ok: bool) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        _remaining(sock, deadline)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if eof_ok and not buf:
                return None
            raise ConnectionError(f"stream ended {len(buf)} bytes into a {n}-byte read")
        buf += chunk
    return bytes(buf)


def decode_message(body: bytes) -> object:
    """msgpack -> Python; any malformation is a ControlError (msgpack raises a dozen kinds)."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - ExtraData, FormatError, StackError, UnicodeDecodeError, ...
        raise ControlError(f"malformed message: {type(e).__name__}: {e}") from None


def validate_request(message: object) -> tuple[int, str, dict]:
    """(id, cmd, fields) of a well-formed request, else ControlError naming what is wrong."""
    if not isinstance(message, dict):
        raise ControlError(f"request is a {type(message).__name__}, not a map")
    v = message.get("v")
    if v != VERSION or isinstance(v, bool):
        raise ControlError(f"unsupported protocol version {v!r} (this session speaks {VERSION})")
    rid = message.get("id")
    if not _is_int(rid):
        raise ControlError("field id must be an integer")
    cmd = message.get("cmd")
    if not isinstance(cmd, str) or cmd not in COMMANDS:
        raise ControlError(f"unknown command {cmd!r}")
    schema = COMMANDS[cmd]
    fields = {k: x for k, x in message.items() if k not in ("v", "id", "cmd")}
    for name, value in fields.items():
        if name not in schema:
            raise ControlError(f"{cmd}: unknown field {name!r}")
        want = schema[name].type
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ControlError(f"{cmd}: field {name} must be {want.__name__}, got {type(value).__name__}")
    missing = [name for name, f in schema.items() if f.required and name not in fields]
    if missing:
        raise ControlError(f"{cmd}: missing field {missing[0]}")
    return rid, cmd, fields


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_handoff_lock = threading.Lock()
_handoff = [0, 0.0]   # requests being served, the interval before the first of them


def _handoff_after_fork() -> None:
    """In a child forked while requests were served (by threads it does not have): none is, so the
    interval before them comes back, and a lock a serving thread held is a new one."""
    global _handoff_lock
    _handoff_lock = threading.Lock()
    if _handoff[0]:
        sys.setswitchinterval(_handoff[1])
    _handoff[:] = [0, 0.0]


os.register_at_fork(after_in_child=_handoff_after_fork)


@contextlib.contextmanager
def prompt_gil() -> Iterator[None]:
    """Run the block with the GIL handed back within HANDOFF_S; the last request out restores the
    interval the first found."""
    with _handoff_lock:
        if not _handoff[0]:
            _handoff[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(_handoff[1], HANDOFF_S))
        _handoff[0] += 1
    try:
        yield
    finally:
        with _handoff_lock:
            _handoff[0] -= 1
            if not _handoff[0]:
                sys.setswitchinterval(_handoff[1])


def _reply(rid: int | None, *, result: object = None, error: str | None = None) -> dict:
    if error is not None:
        return {"v": VERSION, "id": rid, "ok": False, "error": error}
    return {"v": VERSION, "id": rid, "ok": True, "result": result}


# --- server ---------------------------------------------------------------------------------------

class ControlServer:
    """``ControlServer({"maps": fn, ...}).start()``: serves ``<dir>/<pid>.sock`` until ``stop()``.

    A handler gets the request's fields (without v/id/cmd) and returns a msgpack-able result, or raises
    EgpuError for an error reply. ``ping`` answers {pid, uid, argv} unless a handler replaces it.
    Handlers run on their connection's thread; those of EXCLUSIVE commands one at a time.
    """

    def __init__(self, handlers: Mapping[str, Handler], *, directory: Path | None = None,
                 frame_timeout: float = FRAME_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> None:
        unknown = set(handlers) - set(COMMANDS)
        if unknown:
            raise ControlError(f"handlers for unknown commands: {', '.join(sorted(unknown))}")
        self.handlers = {"ping": _ping, **handlers}
        self.directory = directory          # None: socket_dir(create=True), chosen at start
        self.path: Path | None = None
        self.frame_timeout = frame_timeout
        self.max_connections = max_connections
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = (_high(s) for s in socket.socketpair())
        self._files: dict[int, tuple[int, int] | None] = {}   # fd -> (st_dev, st_ino) of each socket of ours
        self._remember(self._wake_r, self._wake_w)
        self._conns: set[socket.socket] = set()   # open connections, each served by a thread of its own
        self._conns_lock = threading.Lock()
        self._exclusive = threading.Lock()        # held by a handler of an EXCLUSIVE command
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner = (0, 0, 0)  # (pid, st_dev, st_ino) of the socket we bound, to remove only ours

    def start(self) -> "ControlServer":
        if self.directory is None:
            self.directory = socket_dir(create=True)
        check_private_dir(self.directory, create=True)
        self.path = socket_path(os.getpid(), self.directory)
        if len(os.fsencode(self.path)) > _SUN_PATH_MAX:
            raise ControlError(f"{self.path}: longer than a unix socket path may be ({_SUN_PATH_MAX} bytes)")
        self.path.unlink(missing_ok=True)  # left by an earlier process with our pid
        listener = _high(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC))
        try:
            listener.bind(os.fspath(self.path))
            # bind() honours the umask; the 0700 directory already keeps others out in the meantime.
            os.chmod(self.path, 0o600)
            listener.listen(socket.SOMAXCONN)
        except OSError as e:
            listener.close()
            raise ControlError(f"{self.path}: cannot listen: {e.strerror}") from None
        listener.setblocking(False)
        st = os.stat(self.path)
        self._owner = (os.getpid(), st.st_dev, st.st_ino)
        self._listener = listener
        self._remember(listener)
        self._thread = threading.Thread(target=self._serve, name="egpu-control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the socket and remove it (only in the process that created it)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        wakeable = self._ours(self._wake_r) and self._ours(self._wake_w)
        if wakeable:   # else the serving thread, a daemon, waits on for what can never come
            self._wake_w.send(b"x")
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:  # their threads see the end of stream and close them
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if wakeable and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:   # a number the program reused is its file now: let go of it unclosed
                s.close() if self._ours(s) else s.detach()
        self._listener = None
        pid, dev, ino = self._owner
        if self.path is None:   # never started
            return
        try:
            st = os.stat(self.path)
            if pid == os.getpid() and (st.st_dev, st.st_ino) == (dev, ino):
                self.path.unlink()
        except OSError:   # gone, or out of reach of a process that changed its uid since
            pass

    def _remember(self, *socks: socket.socket) -> None:
        for sock in socks:
            self._files[sock.fileno()] = identity(sock.fileno())

    def _ours(self, sock: socket.socket) -> bool:
        """Whether ``sock``'s descriptor is still the socket we made: a program may close every descriptor
        (as a daemon does) and open its own files on their numbers."""
        now = identity(sock.fileno())
        return now is not None and self._files.get(sock.fileno()) == now

    def __enter__(self) -> "ControlServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self) -> None:
        # poll(), not epoll: an epoll instance is a descriptor, one the job may close and reuse for a file of its own,
        # which the selector's close then closed
        with selectors.PollSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r or self._stopping.is_set():
                        return
                    try:
                        conn, _ = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:   # out of descriptors: the queue waits until a connection closes
                        if not self._ours(self._listener):   # or closed by the job (poll says so at once, for ever)
                            return
                        time.sleep(0.05)
                        continue
                    with self._conns_lock:
                        open_now = len(self._conns)
                        if open_now < self.max_connections:
                            self._conns.add(conn)
                    if open_now >= self.max_connections:
                        _refuse(conn, f"busy: {open_now} connections open, the most it serves at once")
                        continue
                    threading.Thread(target=self._serve_connection, args=(conn,), name="egpu-control-conn",
                                     daemon=True).start()

    def _serve_connection(self, conn: socket.socket) -> None:
        try:
            self._connection(conn)
        except OSError:
            pass  # the client went away, or took longer than a frame may: only its connection ends
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            conn.close()

    def _connection(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        _, uid, _ = peer_credentials(conn)
        if not peer_allowed(uid, os.geteuid()):
            self._send(conn, encode_frame(_reply(None, error=f"uid {uid} may not control process "
                                                             f"{os.getpid()} (uid {os.geteuid()})")))
            return
        while not self._stopping.is_set():
            try:
                body = read_frame(conn, time.monotonic() + self.frame_timeout)
            except _FrameTooLarge as e:
                self._send(conn, encode_frame(_reply(None, error=f"frame of {e.size} bytes exceeds the "
                                                                 f"{MAX_FRAME >> 20} MiB limit")))
                return
            if body is None:
                return
            self._send(conn, self._answer(body))

    def _send(self, conn: socket.socket, frame: bytes) -> None:
        """Reply within the frame timeout (sendall's timeout is for the whole reply), without SIGPIPE: the
        embedded interpreter leaves the application's default disposition, under which a client that gave
        up and closed would kill the application (it gets EPIPE instead)."""
        conn.settimeout(self.frame_timeout)
        conn.sendall(frame, socket.MSG_NOSIGNAL)

    def _answer(self, body: bytes) -> bytes:
        """The reply frame for one request frame; never raises."""
        rid = None
        try:
            message = decode_message(body)
            if isinstance(message, dict) and _is_int(message.get("id")):
                rid = message["id"]
            rid, cmd, fields = validate_request(message)
            handler = self.handlers.get(cmd)
            if handler is None:
                raise ControlError(f"{cmd} is not supported by this session")
            with prompt_gil():
                if cmd in EXCLUSIVE:
                    with self._exclusive:
                        result = handler(fields)
                else:
                    result = handler(fields)
            reply = _reply(rid, result=result)
        except EgpuError as e:
            reply = _reply(rid, error=str(e))
        except Exception as e:  # noqa: BLE001 - a handler bug must not reach the application
            reply = _reply(rid, error=f"internal error: {type(e).__name__}: {e}")
        try:
            return encode_frame(reply)
        except ControlError as e:
            return encode_frame(_reply(rid, error=f"reply too large: {e.reason}"))
        except Exception as e:  # noqa: BLE001 - a result msgpack cannot encode
            return encode_frame(_reply(rid, error=f"internal error: result cannot be encoded: {e}"))


def _high(sock: socket.socket) -> socket.socket:
    """``sock`` moved onto a number of egpu's (descriptors.high), away from those a job's files take."""
    return socket.socket(fileno=high(sock.detach()))


def _refuse(conn: socket.socket, reason: str) -> None:
    """Tell a connection the server will not serve why (a short reply into an empty socket buffer: it
    never blocks the accepting thread) and close it."""
    try:
        conn.send(encode_frame({**_reply(None, error=reason), "busy": True}), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
    except OSError:
        pass
    conn.close()


def _ping(fields: dict) -> dict:
    try:
        argv = [a.decode(errors="replace") for a in Path("/proc/self/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        argv = []
    return {"pid": os.getpid(), "uid": os.getuid(), "argv": argv}


# --- client ---------------------------------------------------------------------------------------

class ControlClient:
    """Requests to the egpu session in process ``pid``: ``ControlClient(1234).request("maps")``.
    ``directory``: where its socket is (default: the one of socket_dirs() that has it).

    Made before a command's slow first steps (egpu restore verifies every byte of its checkpoint before it
    asks), it tells a process that exited meanwhile from one that never had a session: it notes whether
    the session's socket was there, its process running, when it was made."""

    def __init__(self, pid: int, *, directory: Path | None = None, timeout: float = 10.0) -> None:
        self.pid = pid
        self.directory = directory
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._served = self._serving()

    def _serving(self) -> bool:
        try:
            path = socket_path(self.pid, self.directory)
        except ControlError:   # no directory of ours: no session
            return False
        try:
            bound = path.stat().st_mtime
        except OSError:
            return False
        return process_exists(self.pid) and not _zombie(self.pid) and not _bound_before_start(bound, self.pid)

    def _gone(self, cmd: str, path: Path) -> str | None:
        """Why a connection broke, or could not be made, when it is that the process ended during ``cmd``: it
        is gone, a zombie, or it removed its socket (the runtime does at exit, then writes its dump and lets
        CUDA tear down, seconds on a GPU); None when it still runs. A process exits a little after its
        socket closes: waited for 0.5 s."""
        for _ in range(10):
            if not process_exists(self.pid) or _zombie(self.pid) or not path.exists():
                return f"process {self.pid} exited during {cmd}"
            time.sleep(0.05)
        return None

    def request(self, cmd: str, **fields: object) -> object:
        """Send one request and return its result within ``timeout`` seconds; EgpuError on any failure
        or error reply (ControlBusy when the session serves as many clients as it may)."""
        rid = next(self._ids)
        message = {"v": VERSION, "id": rid, "cmd": cmd, **fields}
        validate_request(message)  # the server checks too; this names the mistake before connecting
        frame = encode_frame(message)
        path = socket_path(self.pid, self.directory)
        if not check_private_dir(path.parent, create=False):
            raise NoSession(f"no egpu session in process {self.pid}")
        deadline = time.monotonic() + self.timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            self._connect(sock, path, deadline, cmd)
            try:
                try:
                    _remaining(sock, deadline)
                    sock.sendall(frame)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before it read our request: its reason is waiting to be read
                waited = self._await_reply(sock, deadline)
                body = read_frame(sock, deadline) if waited is None else None
            except (socket.timeout, TimeoutError):
                waited = self.timeout
            except (_FrameTooLarge, OSError) as e:
                raise ControlError(self._gone(cmd, path) or
                                   f"process {self.pid}: connection failed during {cmd}: {e}") from None
        if waited is not None:
            why = (f": it is stopped (Ctrl-Z, SIGSTOP, a debugger) and answers once it goes on (kill -CONT "
                   f"{self.pid}), when the {cmd} may still be carried out" if is_stopped(self.pid) else "")
            raise ControlTimeout(f"process {self.pid}: no reply to {cmd} within {waited:g} s{why}")
        if body is None:
            raise ControlError(self._gone(cmd, path) or
                               f"process {self.pid}: closed the connection without replying to {cmd}")
        reply = decode_message(body)
        if not isinstance(reply, dict) or reply.get("v") != VERSION or "ok" not in reply:
            raise ControlError(f"process {self.pid}: malformed reply to {cmd}")
        if not reply["ok"]:
            error = ControlBusy if reply.get("busy") is True else ControlError
            raise error(f"process {self.pid}: {reply.get('error') or 'request failed'}")
        if reply.get("id") != rid:
            raise ControlError(f"process {self.pid}: reply to request {reply.get('id')}, expected {rid}")
        return reply.get("result")

    def _await_reply(self, sock: socket.socket, deadline: float) -> float | None:
        """None once the reply starts to arrive (or the connection ends); the seconds waited when the process
        was seen stopped for STOPPED_WAIT_S on end. TimeoutError at ``deadline``. A job stopped by Ctrl-Z kept
        egpu maps waiting its whole minute, egpu checkpoint its ten, saying nothing."""
        start, stopped_since = time.monotonic(), None
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            while not sel.select(min(STOP_POLL_S, max(0.0, deadline - time.monotonic()))):
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError("deadline passed")
                stopped_since = (stopped_since or now) if is_stopped(self.pid) else None
                if stopped_since is not None and now - stopped_since >= STOPPED_WAIT_S:
                    return round(now - start, 1)
        return None

    def _connect(self, sock: socket.socket, path: Path, deadline: float, cmd: str) -> None:
        """Connect: a full listen queue (EAGAIN: a unix socket with a timeout is non-blocking underneath)
        is tried again for BUSY_WAIT_S at most (and never past ``deadline``), then it is ControlBusy. No
        socket, or nobody listening, where the session was when this client was made: its process exited
        during ``cmd``."""
        deadline = min(deadline, time.monotonic() + BUSY_WAIT_S)
        while True:
            try:
                _remaining(sock, deadline)
                sock.connect(os.fspath(path))
                return
            except (FileNotFoundError, ConnectionRefusedError):
                raise NoSession((self._served and self._gone(cmd, path)) or
                                f"no egpu session in process {self.pid}") from None
            except PermissionError:
                raise ControlError(f"process {self.pid}: permission denied on {path}") from None
            except (BlockingIOError, TimeoutError):
                if time.monotonic() + BUSY_RETRY_S >= deadline:
                    raise ControlBusy(f"process {self.pid}: busy: its control socket took no connection "
                                      f"within {min(self.timeout, BUSY_WAIT_S):g} s") from None
                time.sleep(BUSY_RETRY_S)


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state T or t in /proc/PID/stat, after the command's parenthesis)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:stat.rfind(")") + 3] in ("T", "t")


def list_sessions(directory: Path | None = None, *, timeout: float = 1.0) -> list[SessionInfo]:
    """Live sessions of this user, by pid, for ``egpu ps``: in ``directory``, else in every one of
    socket_dirs(). Removes stale sockets: their process is gone, or nothing listens on them (a reused
    pid); and the map mirrors of processes gone (anything else named like them is left alone). A session
    that accepts but is slow to answer, or busy, is kept, with info None."""
    if directory is None:
        return sorted((s for d in socket_dirs() for s in list_sessions(d, timeout=timeout)), key=lambda s: s.pid)
    if not check_private_dir(directory, create=False):
        return []
    sessions = []
    for path in sorted(directory.glob("*.sock"), key=lambda p: (len(p.stem), p.stem)):
        if not path.stem.isdigit() or not path.is_socket():   # not a session's: not ours to remove
            continue
        pid = int(path.stem)
        if not process_exists(pid):
            path.unlink(missing_ok=True)
            continue
        try:
            info = ControlClient(pid, directory=directory, timeout=timeout).request("ping")
        except NoSession:
            path.unlink(missing_ok=True)
            continue
        except ControlError:  # busy, slow or refusing us: alive, details unknown
            info = None
        sessions.append(SessionInfo(pid, path, info if isinstance(info, dict) else None))
    for path in directory.glob("*.maps"):   # runtime/mirror.py's segments of processes gone
        if path.stem.isdigit() and path.is_file() and not process_exists(int(path.stem)):
            path.unlink(missing_ok=True)
    return sessions


def proc_stat(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """/proc/PID/stat's fields after ``(comm)``: state, ppid, ...; None when PID is gone. comm may hold
    spaces and parentheses, so they are counted from the last ')'."""
    try:
        line = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return line[line.rindex(")") + 1:].split()


def _bound_before_start(bound: float, pid: int) -> bool:
    """Whether a socket bound at ``bound`` (its mtime) is older than process ``pid``: one a killed process left,
    its pid now another's. /proc/stat's boot time is in whole seconds: a socket bound less than a second before
    the process started is not told apart (False)."""
    fields = proc_stat(pid)
    try:
        btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines()
                     if ln.startswith("btime "))
        started = btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, TypeError, IndexError, ValueError):
        return False
    return bound < started


def _zombie(pid: int) -> bool:
    fields = proc_stat(pid)
    return bool(fields) and fields[0] == "Z"


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_running(pid: int) -> bool:
    """process_exists, and not a zombie: a daemon's parent is init, which reaps it when it gets to it (in a
    container whose first process reaps nothing, never), so one that ended can stay a zombie for a while."""
    return process_exists(pid) and not _zombie(pid)
