"""The seal of a checkpoint: HMAC-SHA256 of its manifest.json under a key that only this user can read.

Why a key: manifest.json holds every data file's sha256, so a plain checksum of the manifest could be
rewritten together with the data by anyone able to write them. The key is 32 random bytes made once
per user, ``$XDG_STATE_HOME/egpu/checkpoint.key`` (default ``~/.local/state/egpu``), 0600 in a 0700
directory: another local user can neither read it nor forge a seal, and any edit of the manifest (a
careless one too) or of a file it hashes breaks the seal. Not in the runtime directory
($XDG_RUNTIME_DIR, /tmp), which is emptied at logout or reboot: just when a checkpoint is wanted back.
The seal does not stop this user, who holds the key (and may run anything as themselves), or root.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import tempfile
from pathlib import Path

from egpu_preload.control import check_private_dir
from egpu_preload.errors import SnapshotError

KEY_BYTES = 32


def key_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "egpu" / "checkpoint.key"


def seal(data: bytes) -> str:
    """The seal of ``data`` (manifest.json's bytes), hex; makes this user's key the first time."""
    return hmac.new(_key(create=True), data, hashlib.sha256).hexdigest()


def matches(data: bytes, mac: str) -> bool:
    """Whether ``mac`` is the seal of ``data`` under this user's key; SnapshotError when there is no key."""
    expected = hmac.new(_key(create=False), data, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, mac.strip().encode(errors="replace"))   # bytes: any text compares


def _key(*, create: bool) -> bytes:
    path = key_path()
    check_private_dir(path.parent, create=create)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise SnapshotError("no checkpoint key: checkpoints are sealed with a key this user does not "
                                "have (made by another user, or the key was removed)", file=str(path)) from None
        return _make_key(path)
    except OSError as e:  # ELOOP: a symlink
        raise SnapshotError(f"cannot open the checkpoint key: {e.strerror}", file=str(path)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        key = f.read(KEY_BYTES + 1)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or len(key) != KEY_BYTES:
        raise SnapshotError(f"not a checkpoint key private to uid {os.geteuid()} (uid {st.st_uid}, mode "
                            f"{stat.S_IMODE(st.st_mode):04o}, {len(key)} bytes)", file=str(path))
    return key


def _make_key(path: Path) -> bytes:
    """Write a new key whole, then link it into place: a process racing us either wins and we read its
    key, or loses; nobody reads half a key."""
    key = os.urandom(KEY_BYTES)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key-")   # 0600
    try:
        os.write(fd, key)
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return _key(create=False)
    finally:
        os.unlink(tmp)
    return key
