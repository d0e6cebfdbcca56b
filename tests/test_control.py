"""The control protocol: real servers (in a thread and in a subprocess) and clients over real unix
sockets; every kind of malformed frame gets an error reply or a closed connection and the server keeps
serving; stale sockets are cleaned; another uid is refused (for real when the tests run as root)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import msgpack
import pytest

from egpu_preload import control
from egpu_preload.control import (HANDOFF_S, MAX_FRAME, VERSION, ControlBusy, ControlClient, ControlError,
                                  ControlServer, ControlTimeout, NoSession, SessionInfo, list_sessions, socket_path)
from egpu_preload.errors import EgpuError

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534


@pytest.fixture
def sock_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    return tmp_path / "run" / "egpu"


def _attach(fields: dict) -> dict:
    return {"attached": fields["name"], "bytes": len(fields["probe"])}


def _modules(fields: dict) -> object:
    raise EgpuError("no module loaded yet")


def _crash(fields: dict) -> object:
    raise ValueError("handler bug")


HANDLERS = {
    "attach": _attach,
    "detach": lambda f: {"detached": f.get("name")},
    "swap": lambda f: [f["old"], f["new_name"], len(f["new_probe"])],
    "maps": lambda f: {"counts": 42},
    "modules": _modules,
}


@pytest.fixture
def server(sock_dir):
    with ControlServer(HANDLERS, frame_timeout=0.5) as s:
        yield s


def _raw(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(os.fspath(path))
    return s


def _send_body(s: socket.socket, body: bytes) -> None:
    s.sendall(len(body).to_bytes(4, "big") + body)


def _reply(s: socket.socket) -> dict | None:
    body = control.read_frame(s)
    return None if body is None else msgpack.unpackb(body, raw=False)


def _req(cmd: str = "ping", rid: int = 1, **fields) -> bytes:
    return msgpack.packb({"v": VERSION, "id": rid, "cmd": cmd, **fields}, use_bin_type=True)


# --- where sockets live -----------------------------------------------------------------------------

def test_socket_dir_follows_xdg_runtime_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert control.preferred_dir() == tmp_path / "egpu"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert control.preferred_dir() == Path(f"/tmp/egpu-{os.getuid()}")


def test_socket_and_directory_modes_and_removal(server, sock_dir):
    assert server.path == sock_dir / f"{os.getpid()}.sock"
    assert stat.S_IMODE(os.stat(sock_dir).st_mode) == 0o700
    st = os.stat(server.path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    server.stop()
    assert not server.path.exists()


def test_stop_leaves_a_socket_it_did_not_create(sock_dir):
    s = ControlServer({}).start()
    s.path.unlink()
    s.path.write_text("someone else's")  # a different inode at our path
    s.stop()
    assert s.path.read_text() == "someone else's"


@pytest.mark.parametrize("setup, reason", [
    (lambda d: d.mkdir(mode=0o755) or d.chmod(0o755), "mode 0755"),
    (lambda d: d.mkdir(mode=0o700) or os.chown(d, NOBODY, NOBODY), f"owned by uid {NOBODY}"),
    (lambda d: d.symlink_to(d.parent), "not a directory"),
])
def test_directory_not_private_is_refused(setup, reason, tmp_path):
    if "owned" in reason and os.geteuid() != 0:
        pytest.skip("chown needs root")
    d = tmp_path / "egpu"
    setup(d)
    with pytest.raises(ControlError, match=reason):
        ControlServer({}, directory=d).start()
    with pytest.raises(ControlError, match=reason):
        list_sessions(d)


def test_unknown_handler_name_is_refused(sock_dir):
    with pytest.raises(ControlError, match="unknown commands: launch"):
        ControlServer({"launch": lambda f: None})


# --- requests -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd, fields, result", [
    ("attach", {"probe": b"\x7fELF...", "name": "count"}, {"attached": "count", "bytes": 7}),
    ("detach", {}, {"detached": None}),
    ("detach", {"name": "count"}, {"detached": "count"}),
    ("swap", {"old": "a", "new_probe": b"xyz", "new_name": "b"}, ["a", "b", 3]),
    ("maps", {}, {"counts": 42}),
])
def test_requests(server, cmd, fields, result):
    assert ControlClient(os.getpid()).request(cmd, **fields) == result


def test_builtin_ping_names_the_process(server):
    info = ControlClient(os.getpid()).request("ping")
    assert info["pid"] == os.getpid() and info["uid"] == os.getuid() and "pytest" in " ".join(info["argv"])


@pytest.mark.parametrize("cmd, reason", [
    ("modules", "no module loaded yet"),                   # a handler's EgpuError
    ("checkpoint", "checkpoint is not supported"),         # a known command without a handler
])
def test_error_replies(server, cmd, reason):
    fields = {"dir": "/tmp/x"} if cmd == "checkpoint" else {}
    with pytest.raises(ControlError, match=reason):
        ControlClient(os.getpid()).request(cmd, **fields)


@pytest.mark.parametrize("handler, reason", [
    (_crash, "internal error: ValueError: handler bug"),
    (lambda f: object(), "internal error: result cannot be encoded"),
    (lambda f: b"x" * (MAX_FRAME + 1), "reply too large"),
])
def test_handler_failures_are_replies(sock_dir, handler, reason):
    with ControlServer({"maps": handler}):
        client = ControlClient(os.getpid())
        with pytest.raises(ControlError, match=reason):
            client.request("maps")
        assert client.request("ping")["pid"] == os.getpid()


def test_requests_run_with_a_prompt_gil_handoff(sock_dir):
    """Handlers run with the GIL handed back within HANDOFF_S, as their driver calls need when the
    application's threads run Python, two at once included; the interval is restored after the last."""
    seen, inside, leave = {}, threading.Event(), threading.Event()

    def slow(fields):
        inside.set()
        leave.wait(10)
        return sys.getswitchinterval()

    before = sys.getswitchinterval()
    with ControlServer({"attach": slow, "maps": lambda f: sys.getswitchinterval()}):
        client = ControlClient(os.getpid())
        t = threading.Thread(target=lambda: seen.setdefault("attach", client.request("attach", probe=b"", name="x")))
        t.start()
        inside.wait(10)
        seen["maps"] = ControlClient(os.getpid()).request("maps")   # begins and ends inside attach
        leave.set()
        t.join(10)
    assert seen == {"attach": pytest.approx(HANDOFF_S), "maps": pytest.approx(HANDOFF_S)} and HANDOFF_S < before
    assert sys.getswitchinterval() == before


def test_a_child_forked_during_a_request_runs_and_serves_at_the_interval_before_it(sock_dir):
    """A process that forks while a request is served (a DataLoader's workers start whenever the training
    loop says): the child has no request in flight, so it runs at the interval the parent had before the
    request, not at HANDOFF_S for ever, and its own requests hand the GIL off and restore it as the parent's."""
    inside, leave = threading.Event(), threading.Event()

    def slow(fields):
        inside.set()
        leave.wait(10)
        return None

    before = sys.getswitchinterval()
    with ControlServer({"attach": slow}):
        t = threading.Thread(target=lambda: ControlClient(os.getpid()).request("attach", probe=b"", name="x"))
        t.start()
        inside.wait(10)
        r, w = os.pipe()
        child = os.fork()
        if child == 0:   # nothing of pytest's here: the intervals down the pipe, then out
            with control.prompt_gil():
                during = sys.getswitchinterval()
            os.write(w, f"{sys.getswitchinterval()} {during}".encode())
            os._exit(0)
        os.close(w)
        seen = [float(x) for x in os.read(r, 100).split()]
        os.close(r)
        os.waitpid(child, 0)
        leave.set()
        t.join(10)
    assert seen == [before, pytest.approx(HANDOFF_S)]


@pytest.mark.parametrize("cmd, fields, reason", [
    ("launch", {}, "unknown command 'launch'"),
    ("attach", {"probe": "text", "name": "x"}, "field probe must be bytes, got str"),
    ("attach", {"probe": b""}, "attach: missing field name"),
    ("maps", {"json": True}, "maps: unknown field 'json'"),
])
def test_client_checks_requests_before_connecting(sock_dir, cmd, fields, reason):
    with pytest.raises(ControlError, match=reason):
        ControlClient(1).request(cmd, **fields)


def test_oversized_request_is_refused_by_the_client(sock_dir):
    with pytest.raises(ControlError, match="exceeds the 16 MiB frame limit"):
        ControlClient(1).request("attach", probe=bytes(MAX_FRAME), name="big")


def test_no_session(sock_dir):
    with pytest.raises(NoSession, match=r"no egpu session in process 999999999$"):
        ControlClient(999999999).request("ping")


def test_client_timeout(sock_dir):
    with ControlServer({"maps": lambda f: time.sleep(1.0)}):
        with pytest.raises(ControlTimeout, match="no reply to maps within 0.2 s"):
            ControlClient(os.getpid(), timeout=0.2).request("maps")


def test_a_stopped_job_that_does_not_reply_is_named_stopped(sock_dir):
    """egpu maps on a job stopped by Ctrl-Z waited its whole timeout and said only "no reply": the request
    waits in the job's socket and is carried out once the job goes on. (The job here: a stopped child whose
    socket leads to this process's server, which does not answer in time.)"""
    child = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        while open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.01)
        with ControlServer({"maps": lambda f: time.sleep(1.0)}):
            socket_path(child.pid).symlink_to(socket_path(os.getpid()))
            with pytest.raises(ControlTimeout, match=rf"no reply to maps within 0.2 s: it is stopped .*kill -CONT "
                                                     rf"{child.pid}\), when the maps may still be carried out$"):
                ControlClient(child.pid, timeout=0.2).request("maps")
            os.kill(child.pid, signal.SIGCONT)
            with pytest.raises(ControlTimeout, match="no reply to maps within 0.2 s$"):
                ControlClient(child.pid, timeout=0.2).request("maps")
    finally:
        child.kill()
        child.wait()



def test_a_job_stopped_while_it_is_asked_is_given_up_on_in_seconds_not_at_the_timeout(sock_dir, monkeypatch):
    """egpu maps on a job stopped by Ctrl-Z waited its whole minute (egpu checkpoint and restore their ten)
    before saying so: the client gives up once the process has been seen stopped for STOPPED_WAIT_S."""
    monkeypatch.setattr(control, "STOPPED_WAIT_S", 0.3)
    monkeypatch.setattr(control, "STOP_POLL_S", 0.1)
    child = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        with ControlServer({"maps": lambda f: time.sleep(5.0)}):
            socket_path(child.pid).symlink_to(socket_path(os.getpid()))
            start = time.monotonic()
            with pytest.raises(ControlTimeout, match=rf"no reply to maps within 0\.\d s: it is stopped .*kill -CONT "
                                                     rf"{child.pid}\), when the maps may still be carried out$"):
                ControlClient(child.pid, timeout=3).request("maps")
            assert time.monotonic() - start < 2
    finally:
        child.kill()
        child.wait()



def test_ps_says_a_session_that_did_not_answer_is_stopped_when_it_is():
    """egpu ps listed a job stopped by Ctrl-Z as "(busy)"."""
    from egpu_preload.runtime.remote import ps_lines
    child = subprocess.Popen(["sleep", "60"])
    try:
        silent = [SessionInfo(child.pid, Path("x.sock"), None)]
        assert ps_lines(silent)[1].endswith("(busy)")
        os.kill(child.pid, signal.SIGSTOP)
        while not control.is_stopped(child.pid):
            time.sleep(0.01)
        assert ps_lines(silent)[1].endswith(f"(stopped: kill -CONT {child.pid})")
    finally:
        child.kill()
        child.wait()


# --- malformed frames -----------------------------------------------------------------------------

def _packb(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


MALFORMED = [
    (b"\xc1", "malformed message"),                                       # a byte msgpack never uses
    (b"", "malformed message"),                                           # empty frame
    (_req() + b"\x00", "malformed message: ExtraData"),                   # trailing bytes
    (b"\xa2\xff\xfe", "malformed message"),                               # a str that is not UTF-8
    (b"\x91" * 2000 + b"\x00", "malformed message"),                      # nesting deeper than msgpack allows
    (_packb({1: 2}), "malformed message"),                                # a map key that is not a string
    (_packb([1, 2]), "request is a list, not a map"),
    (_packb({"v": 2, "id": 1, "cmd": "ping"}), "unsupported protocol version 2"),
    (_packb({"id": 1, "cmd": "ping"}), "unsupported protocol version None"),
    (_packb({"v": True, "id": 1, "cmd": "ping"}), "unsupported protocol version True"),
    (_packb({"v": 1, "cmd": "ping"}), "field id must be an integer"),
    (_packb({"v": 1, "id": "7", "cmd": "ping"}), "field id must be an integer"),
    (_packb({"v": 1, "id": True, "cmd": "ping"}), "field id must be an integer"),
    (_req("launch"), "unknown command 'launch'"),
    (_packb({"v": 1, "id": 1, "cmd": b"ping"}), "unknown command b'ping'"),
    (_req("attach", probe="not bytes", name="x"), "attach: field probe must be bytes, got str"),
    (_req("attach", probe=b"x", name=3), "attach: field name must be str, got int"),
    (_req("attach", probe=b"x"), "attach: missing field name"),
    (_req("swap", old="a", new_probe=b"", new_name=None), "swap: field new_name must be str, got NoneType"),
    (_req("detach", name=msgpack.ExtType(5, b"x")), "detach: field name must be str, got ExtType"),
    (_req("ping", extra=1), "ping: unknown field 'extra'"),
]


@pytest.mark.parametrize("body, reason", MALFORMED)
def test_malformed_frame_gets_an_error_and_the_connection_stays(server, body, reason):
    with _raw(server.path) as s:
        _send_body(s, body)
        reply = _reply(s)
        assert reply["v"] == VERSION and reply["ok"] is False and reason in reply["error"]
        _send_body(s, _req("ping", rid=9))
        reply = _reply(s)
        assert reply["ok"] and reply["id"] == 9


def test_error_reply_keeps_the_request_id(server):
    with _raw(server.path) as s:
        _send_body(s, _req("launch", rid=77))
        assert _reply(s)["id"] == 77


def test_oversized_frame_gets_an_error_and_is_closed(server):
    with _raw(server.path) as s:
        s.sendall((MAX_FRAME + 1).to_bytes(4, "big") + b"\x80")
        reply = _reply(s)
        assert reply["ok"] is False and f"frame of {MAX_FRAME + 1} bytes exceeds the 16 MiB limit" in reply["error"]
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:  # closed with our unread byte still queued
            pass
    assert ControlClient(os.getpid()).request("maps") == {"counts": 42}


@pytest.mark.parametrize("data", [b"\x00\x00", b"\x00\x00\x00\x10" + b"\x80" * 5])
def test_truncated_frame_closes_and_the_server_keeps_serving(server, data):
    with _raw(server.path) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        assert s.recv(1) == b""
    assert ControlClient(os.getpid()).request("maps") == {"counts": 42}


def test_idle_connection_is_dropped_so_others_get_served(server):
    with _raw(server.path) as idle:
        t0 = time.monotonic()
        assert ControlClient(os.getpid(), timeout=5).request("ping")["pid"] == os.getpid()
        assert time.monotonic() - t0 < 3
        assert idle.recv(1) == b""


# --- peers -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("peer, own, allowed", [
    (1000, 1000, True), (0, 1000, True), (1001, 1000, False), (NOBODY, 0, False), (0, 0, True),
])
def test_peer_allowed(peer, own, allowed):
    assert control.peer_allowed(peer, own) is allowed


def test_peer_credentials_of_a_real_connection():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert control.peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_another_uid_is_refused():
    # pytest's tmp_path is under a 0700 directory: use one that uid 65534 can reach, then open the
    # socket directory and the socket to everyone, so only the SO_PEERCRED check stands in the way.
    base = Path(tempfile.mkdtemp(prefix="egpu-xuid-"))
    try:
        os.chmod(base, 0o755)
        with ControlServer(HANDLERS, directory=base / "egpu") as server:
            os.chmod(base / "egpu", 0o755)
            os.chmod(server.path, 0o666)
            reply = _as_nobody(server.path)
            assert reply.get("ok") is False, reply
            assert f"uid {NOBODY} may not control process {os.getpid()}" in reply["error"]
            os.chmod(base / "egpu", 0o700)
            assert ControlClient(os.getpid(), directory=base / "egpu").request("maps") == {"counts": 42}
    finally:
        shutil.rmtree(base)


def _as_nobody(path: Path) -> dict:
    """The reply a child running as uid 65534 gets to a maps request."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(r)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with _raw(path) as s:
                try:
                    _send_body(s, _req("maps"))
                except BrokenPipeError:
                    pass  # refused before the request was read: the reason is still there to read
                os.write(w, _packb(_reply(s)))
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            os.write(w, _packb({"child_error": repr(e)}))
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(child, 0)
    return msgpack.unpackb(data, raw=False)


# --- sessions ------------------------------------------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(p.stdout)


def _stale_socket(path: Path) -> None:
    """A socket file nobody listens on: bound, then closed without unlinking."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(os.fspath(path))
    s.close()


def test_list_sessions_lists_live_and_removes_stale(server, sock_dir):
    dead = sock_dir / f"{_dead_pid()}.sock"
    _stale_socket(dead)
    reused = sock_dir / f"{os.getppid()}.sock"  # a live process that is not listening
    _stale_socket(reused)
    other = sock_dir / "notes.txt"
    other.write_text("")
    sessions = list_sessions()
    assert [(s.pid, s.path) for s in sessions] == [(os.getpid(), server.path)]
    assert sessions[0].info["pid"] == os.getpid()
    assert not dead.exists() and not reused.exists() and other.exists()


def test_list_sessions_removes_stale_sockets_of_reused_pids_at_once(sock_dir):
    """Sockets jobs killed left (bound before their pid's process started: that pid is another's now) are no
    session: each took egpu ps half a second (waited for, as a process that exits during a command), seconds
    for a few."""
    sock_dir.mkdir(parents=True, mode=0o700)
    others = [subprocess.Popen(["sleep", "30"]) for _ in range(4)]
    try:
        old = time.time() - 3600
        for p in others:
            _stale_socket(sock_dir / f"{p.pid}.sock")
            os.utime(sock_dir / f"{p.pid}.sock", (old, old))
        start = time.monotonic()
        assert list_sessions() == []
        assert time.monotonic() - start < 0.3
        assert list(sock_dir.glob("*.sock")) == []
    finally:
        for p in others:
            p.kill()
            p.wait()


def test_list_sessions_skips_what_is_not_a_socket(server, sock_dir):
    """A directory or a file named like a session's socket or mirror (of a process gone, of a live one) is
    no session, and not removed: egpu ps listed the rest instead of failing with a traceback."""
    odd = [sock_dir / f"{_dead_pid()}.sock", sock_dir / f"{os.getppid()}.sock", sock_dir / f"{_dead_pid()}.maps"]
    for path in odd:
        path.mkdir()
    plain = sock_dir / f"{os.getppid()}.maps"
    plain.write_text("")
    assert [s.pid for s in list_sessions()] == [os.getpid()]
    assert all(path.is_dir() for path in odd) and plain.exists()


def test_list_sessions_without_a_directory(sock_dir):
    assert list_sessions() == []


def test_stale_socket_is_no_session(sock_dir):
    sock_dir.mkdir(parents=True, mode=0o700)
    pid = _dead_pid()
    _stale_socket(sock_dir / f"{pid}.sock")
    with pytest.raises(NoSession, match=f"no egpu session in process {pid}"):
        ControlClient(pid).request("ping")


SERVER_SCRIPT = textwrap.dedent("""
    import sys
    from egpu_preload.control import ControlServer
    from egpu_preload.errors import EgpuError

    def detach(fields):
        raise EgpuError(f"no probe named {fields.get('name')}")

    server = ControlServer({"maps": lambda f: {"pid_maps": [1, 2, 3]}, "detach": detach}).start()
    print("ready", flush=True)
    sys.stdin.read()   # serve until the test closes stdin
    server.stop()
""")


def _serving(script: str) -> subprocess.Popen:
    """A process running ``script`` that has printed "ready"; it serves until its stdin closes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_server_in_a_subprocess(sock_dir):
    proc = _serving(SERVER_SCRIPT)
    try:
        client = ControlClient(proc.pid)
        assert client.request("maps") == {"pid_maps": [1, 2, 3]}
        with pytest.raises(ControlError, match=f"process {proc.pid}: no probe named x"):
            client.request("detach", name="x")
        assert [s.pid for s in list_sessions()] == [proc.pid]
        with _raw(sock_dir / f"{proc.pid}.sock") as s:
            _send_body(s, b"\xc1")
            assert "malformed" in _reply(s)["error"]
        assert client.request("ping")["argv"][:2] == [sys.executable, "-c"]
    finally:
        proc.kill()  # no clean-up runs: the socket stays behind
        proc.wait()
    assert (sock_dir / f"{proc.pid}.sock").exists()
    assert list_sessions() == []
    assert not (sock_dir / f"{proc.pid}.sock").exists()


SLOW_SERVER_SCRIPT = textwrap.dedent("""
    import signal, sys, time
    from egpu_preload.control import ControlServer
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as in an application hosting the embedded interpreter
    server = ControlServer({"maps": lambda f: time.sleep(0.5) or {"n": 1}}).start()
    print("ready", flush=True)
    sys.stdin.read()
    server.stop()
""")


def test_a_client_that_gives_up_does_not_kill_the_application(sock_dir):
    """A reply to a client that timed out and closed must not raise SIGPIPE in the application."""
    proc = _serving(SLOW_SERVER_SCRIPT)
    try:
        with pytest.raises(ControlTimeout):
            ControlClient(proc.pid, timeout=0.1).request("maps")
        time.sleep(0.8)  # the server has replied into the closed connection
        assert ControlClient(proc.pid).request("ping")["pid"] == proc.pid
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_clean_stop_in_a_subprocess_removes_its_socket(sock_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SERVER_SCRIPT], input="", capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout == "ready\n"
    assert list(sock_dir.iterdir()) == []


# --- many clients at once ----------------------------------------------------------------------------

class _Exclusive:
    """attach/detach handlers that count how many of them run at once (they take no lock of their own)."""

    def __init__(self) -> None:
        self.running = self.most = self.done = 0
        self.count_lock = threading.Lock()

    def __call__(self, fields: dict) -> dict:
        with self.count_lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.01)
        with self.count_lock:
            self.running -= 1
            self.done += 1
        return {"ok": True}


def test_stress_idle_slow_and_busy_clients_never_delay_a_good_one(sock_dir):
    """10 idle connections, 3 writers sending a byte every 0.2 s, 8 clients attaching and detaching in a
    loop: a well-behaved client's ping and maps are each answered within 1 s throughout (the old server,
    one connection at a time, made them wait for every idle one); attach/detach never overlap; the slow
    writers are dropped once a frame takes longer than the frame timeout."""
    change = _Exclusive()
    handlers = {"attach": change, "detach": change, "maps": lambda f: {"counts": 42}}
    stop = threading.Event()
    errors: list[str] = []
    with ControlServer(handlers, frame_timeout=1.0) as server:
        idle = [_raw(server.path) for _ in range(10)]
        slow = [_raw(server.path) for _ in range(3)]
        slow_ended: list[float] = []

        def slow_writer(s: socket.socket) -> None:
            t0 = time.monotonic()
            try:
                for byte in (b"\x00\x00\x00\x10" + _req()) * 10:
                    s.send(bytes([byte]))
                    time.sleep(0.2)
            except OSError:
                slow_ended.append(time.monotonic() - t0)

        def changer() -> None:
            client = ControlClient(os.getpid(), timeout=10)
            while not stop.is_set():
                try:
                    client.request("attach", probe=b"\x7fELF", name="p")
                    client.request("detach", name="p")
                except ControlError as e:
                    errors.append(str(e))

        threads = [threading.Thread(target=slow_writer, args=(s,)) for s in slow]
        threads += [threading.Thread(target=changer) for _ in range(8)]
        for t in threads:
            t.start()
        good, latencies = ControlClient(os.getpid(), timeout=5), []
        t_end = time.monotonic() + 2.5
        while time.monotonic() < t_end:
            for cmd in ("ping", "maps"):
                t0 = time.monotonic()
                good.request(cmd)
                latencies.append(time.monotonic() - t0)
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join(timeout=10)
        for s in idle + slow:
            s.close()
    assert not errors, errors[:3]
    assert len(latencies) > 20 and max(latencies) < 1.0, max(latencies)
    assert change.most == 1 and change.done > 16, (change.most, change.done)
    assert len(slow_ended) == 3 and all(t < 2.0 for t in slow_ended), slow_ended


def test_connections_over_the_limit_are_told_busy(sock_dir):
    with ControlServer(HANDLERS, max_connections=2) as server:
        held = [_raw(server.path) for _ in range(2)]
        time.sleep(0.1)   # both accepted
        with pytest.raises(ControlBusy, match=rf"process {os.getpid()}: busy: 2 connections open"):
            ControlClient(os.getpid()).request("maps")
        held.pop().close()
        time.sleep(0.1)
        assert ControlClient(os.getpid()).request("maps") == {"counts": 42}
        held[0].close()


def _full_queue(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket at ``path`` that never accepts, its queue filled."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fspath(path))
    listener.listen(0)
    queued = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(os.fspath(path))
        except BlockingIOError:
            s.close()
            return listener, queued
        queued.append(s)


def test_a_full_listen_queue_is_busy_not_a_traceback(sock_dir):
    sock_dir.mkdir(parents=True, mode=0o700)
    listener, queued = _full_queue(sock_dir / f"{os.getpid()}.sock")
    try:
        t0 = time.monotonic()
        with pytest.raises(ControlBusy, match=rf"process {os.getpid()}: busy: its control socket took no "
                                              r"connection within 0.3 s"):
            ControlClient(os.getpid(), timeout=0.3).request("ping")
        assert time.monotonic() - t0 < 1
        assert [(s.pid, s.info) for s in list_sessions()] == [(os.getpid(), None)]
    finally:
        for s in queued + [listener]:
            s.close()


def test_egpu_maps_and_ps_say_busy_in_one_line(sock_dir):
    sock_dir.mkdir(parents=True, mode=0o700)
    listener, queued = _full_queue(sock_dir / f"{os.getpid()}.sock")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        cli = [sys.executable, "-c", "import launcher; launcher.egpu_main()"]
        maps = subprocess.run(cli + ["maps", str(os.getpid())], env=env, capture_output=True, text=True, cwd=REPO,
                              timeout=120)
        ps = subprocess.run(cli + ["ps"], env=env, capture_output=True, text=True, cwd=REPO, timeout=60)
    finally:
        for s in queued + [listener]:
            s.close()
    assert maps.returncode == 1 and maps.stdout == "", maps
    assert len(maps.stderr.splitlines()) == 1 and f"process {os.getpid()}: busy" in maps.stderr, maps.stderr
    assert ps.returncode == 0 and ps.stderr == "" and f"{os.getpid()}" in ps.stdout and "(busy)" in ps.stdout, ps


# --- a directory someone else made first -------------------------------------------------------------

def _squat(d: Path, how: str) -> None:
    if how == "other owner":
        d.mkdir(mode=0o777)
        d.chmod(0o777)
        os.chown(d, NOBODY, NOBODY)
    elif how == "symlink":
        (d.parent / "elsewhere").mkdir(mode=0o700)
        d.symlink_to(d.parent / "elsewhere")
    else:
        d.mkdir(mode=0o755)
        d.chmod(0o755)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """tempfile's directory (where fallbacks go) moved into the test's."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.mark.parametrize("how", ["other owner", "symlink", "open mode"])
def test_a_squatted_directory_falls_back_to_a_private_one(sock_dir, private_tmp, how, capsys):
    if how == "other owner" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    sock_dir.parent.mkdir()
    _squat(sock_dir, how)
    evil = private_tmp / f"egpu-{os.getuid()}-evil"   # a fallback-looking directory of another user's
    evil.mkdir(mode=0o700)
    os.chown(evil, NOBODY, NOBODY) if os.geteuid() == 0 else evil.chmod(0o777)
    with ControlServer(HANDLERS) as server:
        d = server.directory
        assert d.parent == private_tmp and d.name.startswith(f"egpu-{os.getuid()}-") and d != evil
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"egpu: {sock_dir}: ") and err[0].endswith(f"using {d} instead")
        assert control.socket_dir(create=True) == d and capsys.readouterr().err == ""  # reused, said once
        assert control.socket_dirs() == [d]
        assert ControlClient(os.getpid()).request("maps") == {"counts": 42}
        assert [s.pid for s in list_sessions()] == [os.getpid()]
    assert list(os.scandir(sock_dir)) == []   # nothing of ours went into the squatted directory


@pytest.mark.parametrize("runtime", ["a file", "/proc/1"])
def test_a_runtime_dir_where_none_can_be_made_falls_back_to_a_private_one(tmp_path, private_tmp, monkeypatch,
                                                                          capsys, runtime):
    """$XDG_RUNTIME_DIR a file, or a directory where none can be made (/proc/1): mkdir's OSError was a
    traceback (egpu-run's job never ran, egpu ps failed); now a fallback, said in one line, as for a squatter's."""
    if runtime == "a file":
        runtime = tmp_path / "file"
        runtime.write_text("")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert control.socket_dirs() == [] and list_sessions() == []
    with ControlServer(HANDLERS) as server:
        d = server.directory
        assert d.parent == private_tmp and d.name.startswith(f"egpu-{os.getuid()}-")
        [line] = capsys.readouterr().err.splitlines()
        assert re.fullmatch(rf"egpu: {runtime}/egpu: cannot create it \(.+\): using {d} instead", line), line
        assert control.socket_dirs() == [d]
        assert [s.pid for s in list_sessions()] == [os.getpid()]


def test_a_session_in_a_fallback_is_found_by_another_process(sock_dir, private_tmp, tmp_path):
    sock_dir.parent.mkdir()
    _squat(sock_dir, "symlink")
    env = {**os.environ, "TMPDIR": str(private_tmp), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "ready\n"
        assert ControlClient(proc.pid).request("maps") == {"pid_maps": [1, 2, 3]}
        assert [s.pid for s in list_sessions()] == [proc.pid]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert "instead" in proc.stderr.read()


def test_a_process_that_exits_during_a_request_is_said_to_have_exited(sock_dir):
    """A job ending while egpu attach waits for its reply: 'process N exited during attach', not
    'connection failed during attach: Connection reset by peer' (a helper's sweep)."""
    script = ("import os, socket, sys\n"
              "d = sys.argv[1]\n"
              "os.makedirs(d, mode=0o700, exist_ok=True)\n"
              "s = socket.socket(socket.AF_UNIX); s.bind(f'{d}/{os.getpid()}.sock'); s.listen()\n"
              "print('ready', flush=True)\n"
              "c, _ = s.accept(); c.recv(1 << 16)\n"   # the request read, then gone without a reply
              "os._exit(0)\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(sock_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        with pytest.raises(ControlError, match=f"^process {child.pid} exited during attach$"):
            ControlClient(child.pid).request("attach", probe=b"x", name="count")
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("how", ["killed", "exiting"])
def test_a_process_that_exits_before_a_made_client_connects_is_said_to_have_exited(sock_dir, how):
    """egpu restore makes its client, then verifies the checkpoint (seconds for a big one), then connects: a
    job gone meanwhile (killed: its socket left with nobody listening; exiting: the runtime removed its
    socket and writes its dump) said 'no egpu session in process N', as if it never had one (a sweep)."""
    script = ("import os, socket, sys, time\n"
              "d = sys.argv[1]\n"
              "os.makedirs(d, mode=0o700, exist_ok=True)\n"
              "path = f'{d}/{os.getpid()}.sock'\n"
              "s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen()\n"
              "print('ready', flush=True)\n"
              "if sys.stdin.readline() == 'killed\\n': os._exit(0)\n"
              "os.unlink(path); s.close(); print('stopped', flush=True); time.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(sock_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        client = ControlClient(child.pid)
        child.stdin.write(how + "\n")
        child.stdin.flush()
        if how == "killed":
            child.wait(timeout=10)
        else:
            assert child.stdout.readline() == "stopped\n"
        with pytest.raises(NoSession, match=f"^process {child.pid} exited during restore$"):
            client.request("restore", dir="/x")
    finally:
        child.kill()
        child.wait()


def test_a_process_that_never_had_a_session_is_still_said_to_have_none(sock_dir):
    """The other side of the test above: a running process without a socket is told apart at once."""
    sock_dir.mkdir(mode=0o700, parents=True)
    start = time.monotonic()
    with pytest.raises(NoSession, match=f"^no egpu session in process {os.getppid()}$"):
        ControlClient(os.getppid()).request("restore", dir="/x")
    assert time.monotonic() - start < 0.2
