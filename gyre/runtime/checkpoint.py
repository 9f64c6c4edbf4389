"""Step checkpoints and the record of finished executions, for `--resume` after a kill.

Owns `LoopState` (step, weight version, data position, the groups not yet trained and the
executions in flight), `save_checkpoint` / `save_checkpoint_async` / `latest_checkpoint` (a
folder per step: the trainer side's files, a sha256 manifest of them and `state.json`, published
by rewriting `checkpoints/latest` last, so a kill mid-save leaves the previous one in force),
`ExecutionLedger` (`executions.jsonl`: every finished execution with its task, group and member,
so a resumed run reuses what already ran and trains nothing twice), and `check_run_dir` (the
preflight: whether a folder holds a run, and whether it may be resumed). Knows nothing about
engines, trees or HTTP; `gyre.runtime.elastic_resume` ties these to the elastic runtime.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import msgspec

from gyre.errors import ConfigError, RunDirError
from gyre.runtime.metrics import METRICS_FILE, append_line
from gyre.tasks.outcome import Outcome

__all__ = [
    "LoopState",
    "save_checkpoint",
    "save_checkpoint_async",
    "latest_checkpoint",
    "check_run_dir",
    "LedgerEntry",
    "ExecutionLedger",
    "LEDGER_FILE",
]

LEDGER_FILE = "executions.jsonl"
MANIFEST_FILE = "manifest.json"
"""A checkpoint's sha256 of every trainer file, written before `state.json`."""


class LoopState(msgspec.Struct, frozen=True, kw_only=True):
    """Where the loop is: the next step to run and what it needs to run it identically."""

    step: int = 0
    """Steps completed (trained and published)."""
    version: int = 0
    """Weight version after `step` steps."""
    task_cursor: int = 0
    """Training tasks consumed so far (the data position; the order is a seeded shuffle per
    epoch): in the elastic runtime, the groups begun (`ceil(dispatched / group_size)`)."""
    dispatched: int = 0
    """Executions dispatched so far; the k-th is member `k % group_size` of group
    `k // group_size` (the elastic runtime)."""
    open_groups: tuple[int, ...] = ()
    """Groups begun (index < `task_cursor`) and not yet trained by a step up to `step`: every
    other group below `task_cursor` was trained and is never trained again."""
    in_flight: tuple[str, ...] = ()
    """Execution IDs dispatched and not finished when the checkpoint was taken (a resumed run
    reuses those the ledger holds as finished and runs the others again)."""


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: Path, state: LoopState, save_trainer: Callable[[Path], None], *, keep: int
) -> Path:
    """Write `checkpoints/step-<k>/` (trainer state via `save_trainer`, then `state.json`), then
    point `checkpoints/latest` at it; delete all but the newest `keep`. Returns the folder."""
    folder = _begin(run_dir, state.step)
    save_trainer(folder / "trainer")
    return _publish(run_dir, folder, state, keep)


async def save_checkpoint_async(
    run_dir: Path,
    state: LoopState,
    save_trainer: Callable[[Path], Awaitable[None]],
    *,
    keep: int,
) -> Path:
    """`save_checkpoint` with an awaitable `save_trainer` (a cell's RPC); the file work runs in a
    worker thread. Returns the folder."""
    folder = await anyio.to_thread.run_sync(_begin, run_dir, state.step)
    await save_trainer(folder / "trainer")
    return await anyio.to_thread.run_sync(lambda: _publish(run_dir, folder, state, keep))


def _begin(run_dir: Path, step: int) -> Path:
    """An empty `checkpoints/step-<step>/` (a torn one from a kill mid-save is removed)."""
    folder = run_dir / "checkpoints" / f"step-{step}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _publish(run_dir: Path, folder: Path, state: LoopState, keep: int) -> Path:
    """Manifest, `state.json`, then `checkpoints/latest` -> `folder`; all but the newest `keep`
    checkpoints deleted."""
    root = run_dir / "checkpoints"
    _write_atomic(folder / MANIFEST_FILE, msgspec.json.encode(_digests(folder / "trainer")))
    _write_atomic(folder / "state.json", msgspec.json.encode(state))
    _write_atomic(root / "latest", folder.name.encode())
    steps = sorted(
        (p for p in root.glob("step-*") if p.name[5:].isdigit()), key=lambda p: int(p.name[5:])
    )
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def latest_checkpoint(run_dir: Path) -> tuple[LoopState, Path] | None:
    """The newest complete checkpoint (state, trainer folder), or None if the run has none.
    Raises `RunDirError` naming the file when the checkpoint's state cannot be read, or a trainer
    file differs from the sha256 its manifest recorded at save time (a corrupt file would
    otherwise load as garbage weights without an error)."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    folder = run_dir / "checkpoints" / pointer.read_text(errors="replace").strip()
    way_out = (
        f"remove {str(folder)!r} and {str(pointer)!r} to resume from the start (executions "
        "already in executions.jsonl are reused)"
    )
    try:
        state = msgspec.json.decode((folder / "state.json").read_bytes(), type=LoopState)
        manifest = folder / MANIFEST_FILE
        expected = (
            msgspec.json.decode(manifest.read_bytes(), type=dict[str, str])
            if manifest.exists()
            else None
        )  # checkpoints from before manifests
    except (OSError, msgspec.DecodeError) as exc:
        raise RunDirError(f"checkpoint {str(folder)!r} cannot be read ({exc}): {way_out}") from None
    if expected is not None:
        found = _digests(folder / "trainer")
        bad = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
        if bad:
            raise RunDirError(
                f"checkpoint {str(folder)!r} is corrupt: trainer/{bad[0]} differs "
                f"from its sha256 in {MANIFEST_FILE} ({len(bad)} files): {way_out}"
            )
    return state, folder / "trainer"


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by path relative to it."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            out[path.relative_to(folder).as_posix()] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def check_run_dir(
    run_dir: Path, *, resume: bool, records: Sequence[str] = ()
) -> tuple[LoopState, Path] | None:
    """Preflight of a run folder, before anything is built or started: the newest checkpoint to
    resume from (None: the run starts at step 0; `resume` on a folder without a run starts one).

    A folder holds a run when it has a checkpoint, `metrics.jsonl`, `executions.jsonl` or one of
    `records` (the call log: a run killed in its first evaluation has nothing else). Raises
    `ConfigError` when `run_dir` exists and is not a folder, and when it holds a run that is not
    to be resumed (`resume` is False).
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run_dir={str(run_dir)!r} is not a folder")
    found = latest_checkpoint(run_dir)
    if found is None and not any(
        (run_dir / name).exists() for name in (METRICS_FILE, LEDGER_FILE, *records)
    ):
        return None
    if not resume:
        raise ConfigError(
            f"run_dir={str(run_dir)!r} already holds a run: pass --resume (in Python: "
            "run(config, resume=True)) to continue it, remove it or choose another run_dir"
        )
    return found


class LedgerEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A finished execution: which step, task, group and group slot it filled."""

    step: int
    """The step it was run for (the elastic runtime: the step in progress when it finished; the
    step that trains its group may be a later one)."""
    task_id: str
    slot: int
    """Index within its task's group (0 .. group_size - 1): the group member."""
    outcome: Outcome
    group: int = -1
    """The group's index in dispatch order (the elastic runtime; -1: a one-cell loop entry)."""


class ExecutionLedger:
    """Append-only `executions.jsonl`; every finished execution is written once, fsynced."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LEDGER_FILE
        self._encoder = msgspec.json.Encoder()

    def append(self, entry: LedgerEntry) -> None:
        append_line(self.path, self._encoder.encode(entry))

    def entries(self, step: int | None = None) -> list[LedgerEntry]:
        """The entries of `step` (None: every entry), in the order written; a torn last line
        from a kill is skipped."""
        if not self.path.exists():
            return []
        decoder = msgspec.json.Decoder(LedgerEntry)
        out = []
        for line in self.path.read_bytes().splitlines():
            try:
                entry = decoder.decode(line)
            except msgspec.DecodeError:
                continue  # only a torn tail can fail: each line is written whole and fsynced
            if step is None or entry.step == step:
                out.append(entry)
        return out
