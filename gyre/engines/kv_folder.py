"""The shared KV folder: layout and rules of KV exports that vLLM engines hand each other.

An export of a token sequence of length L, computed with weight version v, is the KV of its first
`(L - 1) // block * block` tokens, one safetensors file per layer under `<shared_dir>/<key>/`
(vLLM's ExampleConnector format), where `key` is the MD5 of those token IDs as int64 followed by
the version's salt (`export_key`, `version_salt`): the same tokens under other weights have
another key, so a cached export is never found for a request of another version. A `complete`
marker holding v, written after the export request finished, makes it loadable
(`mark_complete`, `complete_version`), so a half-written export is never read; `release` deletes
one, `sweep` deletes those older than the lease. `run_folder` makes the folder of one run's
exports (in host memory, /dev/shm) and removes it when the run ends; its owner holds a lock file
in it (`OWNER_LOCK`, `fcntl.flock`) for as long as it keeps it, so a folder whose owner was killed
(kill -9: the kernel drops the lock) is removed by the next one made beside it
(`sweep_run_folders`). Used by the connector inside
vLLM's processes (`gyre.engines.kv_connector`) and by the engine side
(`gyre.engines.kv_transport.FolderTransport`).

Knows nothing about vLLM, requests or engines: only token IDs, keys and files.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = [
    "EXPORT_PARAM",
    "IMPORT_PARAM",
    "VERSION_PARAM",
    "COMPLETE",
    "RUN_FOLDER_PREFIX",
    "OWNER_LOCK",
    "RunFolder",
    "make_run_folder",
    "run_folder",
    "sweep_run_folders",
    "version_salt",
    "stored_tokens",
    "export_key",
    "complete_version",
    "export_bytes",
    "mark_complete",
    "release",
    "sweep",
]

EXPORT_PARAM = "gyre_export"
"""`kv_transfer_params` flag of a request whose prompt the connector stores."""
IMPORT_PARAM = "gyre_import"
"""`kv_transfer_params` flag of a request whose prompt the connector loads, if exported; a
request without it never loads KV from the folder."""
VERSION_PARAM = "gyre_weight_version"
"""`kv_transfer_params` entry beside either flag: the weight version of the export's key."""
COMPLETE = "complete"
"""Marker file of an export that may be loaded."""
RUN_FOLDER_PREFIX = "gyre-kv-"
"""Name prefix of a run's own folder (`make_run_folder`)."""
OWNER_LOCK = ".owner.lock"
"""The lock file in a run's own folder: its owner holds an exclusive `fcntl.flock` on it for as
long as it keeps the folder; the text records the owner (pid, host, when it was made)."""
_KEY = re.compile(r"[0-9a-f]{32,64}")
_SHM = Path("/dev/shm")
logger = logging.getLogger(__name__)


class RunFolder:
    """A run's own KV folder and its owner's lock on it (`make_run_folder`).

    Attributes:
        path: the folder, `<parent>/gyre-kv-<random>`.
    """

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    def remove(self) -> None:
        """Delete the folder with every export in it, then let go of the lock; idempotent."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def make_run_folder(parent: str | Path | None = None) -> RunFolder:
    """A new, empty folder of its own for one run's exports, `<parent>/gyre-kv-<random>` (mode
    0700), locked by this process (`OWNER_LOCK`) until `RunFolder.remove` or its exit; `parent`
    defaults to /dev/shm (host memory) and, where that is no writable folder, to the system's
    temporary folder. First removes the run folders in `parent` whose owner is gone
    (`sweep_run_folders`). The caller removes the new one (`run_folder` does). Raises `OSError`
    when `parent` cannot hold it."""
    if parent is None:
        parent = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else tempfile.gettempdir()
    swept = sweep_run_folders(parent)
    if swept:
        logger.info("removed %d KV folder(s) of dead runs in %s", swept, parent)
    path = Path(tempfile.mkdtemp(prefix=RUN_FOLDER_PREFIX, dir=parent))
    # locked before it gets its name, so a sweep never finds the lock file unheld
    tmp = path / f".owner.{os.getpid()}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        owner = f"pid={os.getpid()} host={socket.gethostname()} made={time.time():.3f}\n"
        os.write(fd, owner.encode())
        os.replace(tmp, path / OWNER_LOCK)
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return RunFolder(path, fd)


@contextmanager
def run_folder(parent: str | Path | None = None) -> Iterator[Path]:
    """A folder of its own (`make_run_folder`) for as long as the block runs; it is removed,
    with every export in it, when the block ends, on an error too."""
    folder = make_run_folder(parent)
    try:
        yield folder.path
    finally:
        folder.remove()


def sweep_run_folders(parent: str | Path) -> int:
    """Remove the run folders (`gyre-kv-*`) in `parent` whose owner is gone: their `OWNER_LOCK`
    exists and no process holds it (one killed with SIGKILL left its folder; the kernel dropped
    its lock). Keeps every folder whose lock is held (a live run's), every one without a lock
    file (a folder given by a user, or being made) and every one this process cannot open;
    returns how many were removed (0 when `parent` does not exist)."""
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return 0
    removed = 0
    for entry in entries:
        if not entry.name.startswith(RUN_FOLDER_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(os.path.join(entry.path, OWNER_LOCK), os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # no lock file, or another user's folder
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its run is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)
        removed += 1
    return removed


def version_salt(weight_version: int) -> str:
    """What the connector hands ExampleConnector as the request's only `mm_hashes` entry, which it
    appends to the token bytes it hashes into the folder name: the export's weight version."""
    return f"gyre-weights-v{weight_version}"


def stored_tokens(length: int, block_size: int) -> int:
    """Tokens an export of a `length`-token sequence stores: the leading whole blocks that leave
    at least one token for the loading engine to compute (0 when the sequence is too short)."""
    return max((length - 1) // block_size * block_size, 0)


def export_key(token_ids: list[int], block_size: int, weight_version: int) -> tuple[str, int]:
    """(key, tokens stored) of the export of `token_ids` computed with `weight_version`: the hash
    ExampleConnector names its folder with, of the stored tokens (`stored_tokens`) as int64 and
    the version's salt (`version_salt`)."""
    n = stored_tokens(len(token_ids), block_size)
    data = np.asarray(
        token_ids[:n], dtype=np.int64
    ).tobytes()  # ExampleConnector hashes int64 tensors
    data += version_salt(weight_version).encode()  # as ExampleConnector appends "-".join(mm_hashes)
    try:
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
    except ValueError:  # FIPS builds: vLLM's safe_hash falls back the same way
        digest = hashlib.sha256(data).hexdigest()
    return digest, n


def _folder(shared_dir: str | Path, key: str) -> Path:
    if not _KEY.fullmatch(key):
        raise ValueError(f"key={key!r} is not an export key (hex digest)")
    return Path(shared_dir) / key


def export_bytes(shared_dir: str | Path, key: str) -> int:
    """Bytes stored under export `key` (0 if absent)."""
    folder = _folder(shared_dir, key)
    try:
        return sum(f.stat().st_size for f in folder.iterdir())
    except FileNotFoundError:
        return 0


def mark_complete(shared_dir: str | Path, key: str, weight_version: int) -> None:
    """Make export `key` loadable (atomic rename); raises `FileNotFoundError` if nothing was
    stored."""
    folder = _folder(shared_dir, key)
    if not any(f.suffix == ".safetensors" for f in folder.iterdir()):
        raise FileNotFoundError(f"export {key} holds no KV files in {folder}")
    tmp = folder / f".{COMPLETE}.{os.getpid()}"
    tmp.write_text(f"{weight_version}\n")
    os.replace(tmp, folder / COMPLETE)


def complete_version(shared_dir: str | Path, key: str) -> int | None:
    """The weight version export `key`'s `complete` marker records; None while it is not loadable
    (absent, half-written, or a marker without a version)."""
    try:
        text = (_folder(shared_dir, key) / COMPLETE).read_text()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def release(shared_dir: str | Path, key: str) -> bool:
    """Delete export `key`; False if it was already gone. Raises `ValueError` for a malformed
    key."""
    folder = _folder(shared_dir, key)
    if not folder.exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def sweep(shared_dir: str | Path, lease_s: float, now: float | None = None) -> int:
    """Delete exports (complete or not) last touched more than `lease_s` seconds ago; returns how
    many. Only folders named like export keys are touched."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(shared_dir))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if not (_KEY.fullmatch(entry.name) and entry.is_dir()):
            continue
        try:
            if now - entry.stat().st_mtime <= lease_s:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    return removed
