"""The append-only call log of one run: every `ModelCall` the proxy recorded, crash-safe.

Owns `CallLog` (the writer, with `LogStatistics`), `read_log` (the reader) and `LogContents`. A log
is a sequence of frames `[u32 length][u32 crc32][msgpack payload]` (little-endian); a payload is a
`CallEntry` (one `ModelCall`; a prompt that extends its parent's prompt + completion is stored as
the parent's call ID plus the new tokens only, so the log grows with new tokens, not history) or an
`EndEntry` (an `ExecutionSummary`, written when the execution closes).

Durability: each frame is written to the OS (one `write` on an O_APPEND descriptor) before the
proxy finishes the response, so a killed process loses no completed call; `fsync` runs when an
execution closes and on a timer (`run_flusher`), against machine crashes. The reader rebuilds
every record, and detects and skips a torn last frame. A write that fails (a full disk, a
file-size limit) cuts its partial frame and raises `ProxyError` (503), so the log stays whole.
Knows nothing about HTTP or rendering.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec

from gyre.errors import LogCorruptError, ProxyError
from gyre.tito.records import ExecutionSummary, ModelCall

__all__ = [
    "CallEntry",
    "EndEntry",
    "CallLog",
    "LogStatistics",
    "LogContents",
    "LogCorruptError",
    "read_log",
    "encode_frame",
]

_HEADER = struct.Struct("<II")
_INLINE_WRITE_BYTES = 64 * 1024
"""Frames up to this size are written from the event loop thread; larger ones in a worker thread."""


class CallEntry(msgspec.Struct, frozen=True, kw_only=True, tag="call"):
    """One model call. With `prompt_base` set, `call.prompt_ids` holds only the tokens after the
    base call's prompt + completion (same execution)."""

    call: ModelCall
    prompt_base: str | None = None


class EndEntry(msgspec.Struct, frozen=True, kw_only=True, tag="end"):
    """An execution was closed."""

    summary: ExecutionSummary


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(CallEntry | EndEntry)


def encode_frame(entry: CallEntry | EndEntry) -> bytes:
    """One length-prefixed, checksummed frame."""
    payload = _ENCODER.encode(entry)
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class LogStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a call log writer (docs/style.md rule 6)."""

    frames_written: int
    """Frames appended (calls and execution summaries)."""
    bytes_written: int
    """Bytes appended, headers included."""
    syncs: int
    """fsync calls that had something to make durable."""


class CallLog:
    """Writer of one run's call log (appends to `path`, creating parent folders).

    Use from one event loop. `append_*` return once the frame is in the OS (survives a killed
    process); `sync` makes it durable on disk.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = anyio.Lock()
        self._dirty = False
        self.frames_written = 0
        self.bytes_written = 0
        self.syncs = 0

    async def _write(self, frame: bytes) -> None:
        async with self._lock:
            if self._fd is None:
                raise RuntimeError(f"call log {str(self.path)!r} is closed")
            size = os.fstat(self._fd).st_size  # O_APPEND: the frame starts here
            try:
                if len(frame) <= _INLINE_WRITE_BYTES:
                    n = os.write(self._fd, frame)  # a small append to the page cache: µs
                else:
                    n = await anyio.to_thread.run_sync(os.write, self._fd, frame)
                if n != len(frame):  # a full disk or a file-size limit takes part of the frame
                    raise OSError(errno.ENOSPC, f"short write ({n} of {len(frame)} bytes)")
            except OSError as exc:
                # Cut the partial frame, or every frame after it would sit behind a corrupt one.
                os.ftruncate(self._fd, size)
                raise ProxyError(
                    f"call log {str(self.path)!r} cannot be written ({exc.strerror or exc}): "
                    "the call was not recorded",
                    status=503,
                    error_code="call_log_unwritable",
                ) from exc
            self._dirty = True
            self.frames_written += 1
            self.bytes_written += len(frame)

    async def append_call(self, call: ModelCall, *, base: tuple[str, int] | None = None) -> None:
        """Append one call. `base=(parent_call_id, n)`: the first n prompt IDs are the parent's
        prompt + completion, so only the rest is written."""
        if base is not None:
            call_id, n = base
            entry = CallEntry(
                call=msgspec.structs.replace(call, prompt_ids=call.prompt_ids[n:]),
                prompt_base=call_id,
            )
        else:
            entry = CallEntry(call=call)
        await self._write(encode_frame(entry))

    async def append_end(self, summary: ExecutionSummary) -> None:
        """Append an execution's summary and make the log durable."""
        await self._write(encode_frame(EndEntry(summary=summary)))
        await self.sync()

    async def sync(self) -> None:
        """fsync the log if anything was written since the last sync."""
        async with self._lock:
            if self._fd is None or not self._dirty:
                return
            self._dirty = False
            await anyio.to_thread.run_sync(os.fsync, self._fd)
            self.syncs += 1

    async def run_flusher(self, interval_s: float) -> None:
        """Sync every `interval_s` seconds until cancelled (run it in the node's task group)."""
        while True:
            await anyio.sleep(interval_s)
            await self.sync()

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            frames_written=self.frames_written, bytes_written=self.bytes_written, syncs=self.syncs
        )

    def close(self) -> None:
        """fsync and close (blocking: call at shutdown)."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


@dataclass
class LogContents:
    """Everything a log holds, rebuilt."""

    calls: list[ModelCall] = field(default_factory=list)
    """Every call with full prompt IDs, in the order written."""
    summaries: dict[str, ExecutionSummary] = field(default_factory=dict)
    """Closed executions by ID."""
    torn_bytes: int = 0
    """Bytes of an incomplete or corrupt last frame that were skipped (0: clean end)."""
    unresolved: int = 0
    """Calls skipped because their prompt base was missing from the log."""

    def for_execution(self, execution_id: str) -> list[ModelCall]:
        return [c for c in self.calls if c.execution_id == execution_id]


def read_log(path: str | os.PathLike[str]) -> LogContents:
    """Rebuild a call log. A torn last frame (short header, short payload or bad checksum at the
    end) is skipped and counted in `torn_bytes`.

    Raises LogCorruptError when a frame that is followed by more data is corrupt, FileNotFoundError
    when there is no log."""
    data = Path(path).read_bytes()
    out = LogContents()
    known: dict[tuple[str, str], ModelCall] = {}
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < _HEADER.size:
            out.torn_bytes = end - pos
            break
        length, crc = _HEADER.unpack_from(data, pos)
        start, stop = pos + _HEADER.size, pos + _HEADER.size + length
        bad = stop > end or zlib.crc32(data[start:stop]) != crc
        if bad:
            # A torn tail is the last thing in the file; anything after a bad frame is corruption.
            if stop >= end:
                out.torn_bytes = end - pos
                break
            raise LogCorruptError(
                f"{path}: frame at byte {pos} fails its checksum ({end - stop} bytes follow)"
            )
        try:
            entry = _DECODER.decode(data[start:stop])
        except msgspec.DecodeError as exc:
            raise LogCorruptError(f"{path}: frame at byte {pos} does not decode: {exc}") from None
        pos = stop
        if isinstance(entry, EndEntry):
            out.summaries[entry.summary.execution_id] = entry.summary
            continue
        call = entry.call
        if entry.prompt_base is not None:
            base = known.get((call.execution_id, entry.prompt_base))
            if base is None:
                out.unresolved += 1
                continue
            call = msgspec.structs.replace(
                call, prompt_ids=base.prompt_ids + base.completion_ids + call.prompt_ids
            )
        known[(call.execution_id, call.call_id)] = call
        out.calls.append(call)
    return out
