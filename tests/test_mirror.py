"""The map mirror (runtime/mirror.py): the segment's seqlock, growth and refusals, and a stand-in job
whose maps ``egpu maps PID --mirror`` reads without asking it anything."""

from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
import time

import msgpack
import pytest

from egpu_preload.errors import EgpuError
from egpu_preload.runtime import mirror
from test_live import LAUNCH, Job, egpu, probes  # noqa: F401 (a fixture)


def _read(tmp_path):
    """The segment of this process in ``tmp_path`` (read_mirror also wants a document of egpu's)."""
    return mirror.read_segment(mirror.mirror_path(os.getpid(), tmp_path))


def test_documents_grow_the_segment_and_read_back_whole(tmp_path):
    seg = mirror.Segment(mirror.mirror_path(os.getpid(), tmp_path))
    seg.write(msgpack.packb({"n": 1}))
    assert _read(tmp_path)[0] == {"n": 1} and os.stat(seg.path).st_mode & 0o777 == 0o600
    small = os.stat(seg.path).st_ino
    big = {"blob": b"x" * (3 * mirror.MIN_SIZE)}
    seg.write(msgpack.packb(big))                      # does not fit: a new file, renamed over the old
    doc, when = _read(tmp_path)
    assert doc == big and os.stat(seg.path).st_ino != small and abs(when - time.time()) < 60
    seg.write(msgpack.packb({"n": 2}))                 # in place again
    assert _read(tmp_path)[0] == {"n": 2}
    seg.close()
    assert not seg.path.exists()


def test_a_reader_never_sees_a_torn_document(tmp_path):
    seg = mirror.Segment(mirror.mirror_path(os.getpid(), tmp_path))
    seg.write(msgpack.packb({"i": 0, "pad": [0] * 1000}))
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            seg.write(msgpack.packb({"i": i, "pad": [i] * 1000}))
            time.sleep(0)   # lets the reader have the GIL between writes: on a loaded machine it could
            # otherwise find a writer inside on all of its retries ("did not settle"), which is not a tear

    t = threading.Thread(target=writer)
    t.start()
    seen: list[dict] = []
    deadline = time.monotonic() + 30
    try:   # 300 reads at least, among them documents of several writes (the reader alone can take all 300
        # while the writer waits for the GIL on a loaded machine: seen once in CI, every read of one write)
        while (len(seen) < 300 or len({d["i"] for d in seen}) < 3) and time.monotonic() < deadline:
            seen.append(_read(tmp_path)[0])
            time.sleep(0)
    finally:
        stop.set()
        t.join()
        seg.close()
    assert all(d["pad"] == [d["i"]] * 1000 for d in seen)
    assert len({d["i"] for d in seen}) >= 3


def test_a_segment_being_written_is_waited_for(tmp_path):
    seg = mirror.Segment(mirror.mirror_path(os.getpid(), tmp_path))
    seg.write(msgpack.packb({"n": 1}))
    with open(seg.path, "r+b") as f:                   # a writer stuck inside: the sequence stays odd
        f.seek(mirror.SEQ_AT)
        f.write(struct.pack("<I", 3))
    with pytest.raises(EgpuError, match="did not settle"):
        _read(tmp_path)
    seg.close()


@pytest.mark.parametrize("content, reason", [
    (None, "no map mirror"),
    (b"short", "too short"),
    (b"NOTAMAP!" + bytes(40), "bad magic"),
    (mirror.HEADER.pack(mirror.MAGIC, 0, 0, 0, 0), "no document yet"),
    (mirror.HEADER.pack(mirror.MAGIC, 2, 0, 3, 0) + b"\xc1\xc1\xc1", "corrupt map mirror"),
])
def test_bad_segments_are_refused_naming_the_file(tmp_path, content, reason):
    path = mirror.mirror_path(os.getpid(), tmp_path)
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(EgpuError, match=reason) as e:
        _read(tmp_path)
    assert e.value.file == str(path)



@pytest.mark.parametrize("doc, version", [({"version": 99, "probes": "?"}, "99"), ([1, 2], "None"), ({}, "None")])
def test_a_mirror_of_another_egpus_is_refused_naming_the_file(tmp_path, doc, version):
    """egpu maps --mirror on a job of another egpu (another document version), or a document that is no
    dump at all: a traceback (TypeError, KeyError) as it was rendered, or its maps misread."""
    from egpu_preload.runtime.dump import VERSION
    seg = mirror.Segment(mirror.mirror_path(os.getpid(), tmp_path))
    seg.write(msgpack.packb(doc))
    with pytest.raises(EgpuError, match=rf"not a map mirror this egpu reads \(document version {version}, not "
                                        rf"{VERSION}\)") as e:
        mirror.read_mirror(os.getpid(), tmp_path)
    assert e.value.file == str(seg.path)
    seg.write(msgpack.packb({"version": VERSION}))
    assert mirror.read_mirror(os.getpid(), tmp_path)[0] == {"version": VERSION}
    seg.close()


def test_a_mirror_under_a_file_is_no_mirror(tmp_path):
    """$XDG_RUNTIME_DIR a file: egpu maps --mirror said only "Not a directory"."""
    (tmp_path / "file").write_text("")
    with pytest.raises(EgpuError, match="no map mirror"):
        _read(tmp_path / "file")


def test_the_segment_of_a_process_gone_is_removed(tmp_path):
    pid = 2 ** 22 + 12345   # above any pid_max default: no such process
    path = mirror.mirror_path(pid, tmp_path)
    path.write_bytes(b"")
    with pytest.raises(EgpuError, match=f"process {pid} is not running"):
        mirror.read_mirror(pid, tmp_path)
    assert not path.exists()


def test_a_job_mirrors_its_maps_for_egpu_maps(stub_job, tmp_path, monkeypatch, probes):
    """A stand-in job with count attached from the start: the shim adds each launch's 32 threads to the probe's
    map (the stand-in would add 1 at an instrumented launch: EGPU_STUB_PROBE_COUNTS), so the mirror's count grows
    by whole launches and never runs ahead of them; the segment is gone when the job ends."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path, options=("--mirror", "0.05", "-p", str(probes["count"])),
              EGPU_STUB_PROBE_COUNTS="1")
    with job:
        path = mirror.mirror_path(job.pid, job.dir)
        counts = []
        for _ in range(3):
            job.wait_launches(10)
            time.sleep(0.2)
            r = egpu(["maps", str(job.pid), "--mirror", "--json"], job.env)
            assert r.returncode == 0, r.stderr
            counts.append(json.loads(r.stdout)["maps"]["counts"]["value"])
            assert 0 < counts[-1] <= 32 * job.launches() and counts[-1] % 32 == 0, counts
        text = egpu(["maps", str(job.pid), "--mirror"], job.env)
        assert text.returncode == 0 and text.stdout.startswith("@counts: "), text
        assert path.exists() and os.stat(path).st_mode & 0o777 == 0o600
        status, _, err = job.finish()
    assert status == 0, err
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert 32 * len(LAUNCH.findall(job.log.read_text())) >= counts[-1]
    assert not path.exists()


def test_no_mirror_when_its_period_is_zero(stub_job, tmp_path, monkeypatch, probes):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path, options=("--mirror", "0", "-p", str(probes["count"])))
    try:
        time.sleep(0.3)
        r = egpu(["maps", str(job.pid), "--mirror"], job.env)
    finally:
        job.finish()
    assert r.returncode == 1 and "no map mirror" in r.stderr


@pytest.mark.parametrize("period", [float("inf"), 1e300])
def test_a_period_too_long_for_a_wait_means_never(tmp_path, period):
    """egpu-run --mirror inf: no OverflowError in the mirror's thread (a traceback in the job's stderr)."""
    errors = []
    old, threading.excepthook = threading.excepthook, errors.append
    try:
        m = mirror.Mirror(lambda: {"probes": []}, period, tmp_path / "1.maps").start()
        time.sleep(0.2)
        m.stop()
    finally:
        threading.excepthook = old
    assert errors == [] and not m._thread.is_alive()


def test_no_private_directory_means_no_mirror_and_one_line(tmp_path, monkeypatch, capsys):
    """Another user's directory where the sockets go and no fallback made yet (the control socket failed
    to start): the runtime runs on without a mirror, never writing the maps into that directory."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "theirs").mkdir()
    (tmp_path / "egpu").symlink_to(tmp_path / "theirs")
    assert mirror.start(lambda: None, 1.0) is None
    err = capsys.readouterr().err
    assert err.startswith(f"egpu[{os.getpid()}]: no map mirror: {tmp_path / 'egpu'}: not a directory"), err
    assert len(err.splitlines()) == 1 and list((tmp_path / "theirs").iterdir()) == []
