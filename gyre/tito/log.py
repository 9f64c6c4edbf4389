"""The append-only call log of one run: every `ModelCall` the proxy recorded, crash-safe.

Owns `CallLog` (the writer, with `LogStatistics`), `read_log` (the reader: one streaming pass),
`LogContents`, `iter_frames` and `LogResolver` (frames and entries to records). A log
is a sequence of frames `[u32 length][u32 crc32][msgpack payload]` (little-endian); a payload is a
`CallEntry` (one `ModelCall` in reference form: the parent's call ID, how many of its tokens the
prompt shares, and the new tokens only, so the log grows with new tokens, not history) or an
`EndEntry` (an `ExecutionSummary`, written when the execution closes). Logs written before the
reference form (tag `call`: a whole prompt, or `prompt_base` + the tokens after the base's prompt
+ completion) still read, as reference records.

Durability: each frame is written to the OS (one `write` on an O_APPEND descriptor) before the
proxy finishes the response, so a killed process loses no completed call; `fsync` runs when an
execution closes and on a timer (`run_flusher`), against machine crashes. The reader rebuilds
every record in one pass over the file, never holding it whole, and detects and skips a torn last
frame. A write that fails (a full disk, a
file-size limit) cuts its partial frame and raises `ProxyError` (503), so the log stays whole.
Knows nothing about HTTP or rendering.
"""

from __future__ import annotations

import errno
import io
import os
import struct
import zlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec

from gyre.errors import LogCorruptError, ProxyError
from gyre.tito.records import (
    ExecutionSummary,
    ExecutionTokens,
    FullCall,
    ModelCall,
    common_prefix_len,
)

__all__ = [
    "CallEntry",
    "LegacyCallEntry",
    "EndEntry",
    "CallLog",
    "LogStatistics",
    "LogContents",
    "LogCorruptError",
    "LogResolver",
    "read_log",
    "iter_frames",
    "decode_entry",
    "encode_frame",
]

_HEADER = struct.Struct("<II")
_INLINE_WRITE_BYTES = 64 * 1024
"""Frames up to this size are written from the event loop thread; larger ones in a worker thread."""


class CallEntry(msgspec.Struct, frozen=True, kw_only=True, tag="ref"):
    """One model call in reference form (`ModelCall.shared_len` + `prompt_tail`)."""

    call: ModelCall


class LegacyCallEntry(msgspec.Struct, frozen=True, kw_only=True, tag="call"):
    """A call as logs before the reference form stored it: the whole prompt, or with
    `prompt_base` set only the tokens after the base call's prompt + completion. Read only."""

    call: FullCall
    prompt_base: str | None = None


class EndEntry(msgspec.Struct, frozen=True, kw_only=True, tag="end"):
    """An execution was closed."""

    summary: ExecutionSummary


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(CallEntry | LegacyCallEntry | EndEntry)


def decode_entry(payload: bytes) -> CallEntry | LegacyCallEntry | EndEntry:
    """One frame's payload. Raises `msgspec.DecodeError` when it is not an entry."""
    return _DECODER.decode(payload)


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

    async def append_call(self, call: ModelCall) -> None:
        """Append one call (reference form: O(its new tokens) bytes)."""
        await self._write(encode_frame(CallEntry(call=call)))

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
    """Everything a log holds (of the executions asked for), rebuilt."""

    calls: list[ModelCall] = field(default_factory=list)
    """Every call in reference form, in the order written."""
    summaries: dict[str, ExecutionSummary] = field(default_factory=dict)
    """Closed executions by ID."""
    torn_bytes: int = 0
    """Bytes of an incomplete or corrupt last frame that were skipped (0: clean end)."""
    unresolved: int = 0
    """Calls skipped because the parent their prompt shares tokens with was missing from the
    log."""

    def for_execution(self, execution_id: str) -> list[ModelCall]:
        """The calls of one execution, in log order (reference form)."""
        return [c for c in self.calls if c.execution_id == execution_id]


_READ_BYTES = 1 << 20


def iter_frames(
    path: str | os.PathLike[str], torn: list[int] | None = None
) -> Iterator[tuple[int, bytes]]:
    """(byte offset, payload) of every whole frame of a call log, in order, read in one
    streaming pass (never the whole file in memory). A torn last frame (short header, short
    payload or bad checksum at the end) ends the iteration; its size is appended to `torn`
    when given.

    Raises LogCorruptError when a frame that is followed by more data is corrupt,
    FileNotFoundError when there is no log."""
    with open(path, "rb", buffering=0) as f:
        end = os.fstat(f.fileno()).st_size  # frames appended while reading are left for later
        reader = io.BufferedReader(f, _READ_BYTES)
        pos = 0
        while pos < end:
            if end - pos < _HEADER.size:
                break
            length, crc = _HEADER.unpack(reader.read(_HEADER.size))
            stop = pos + _HEADER.size + length
            payload = reader.read(min(length, end - pos - _HEADER.size))
            if stop > end or zlib.crc32(payload) != crc:
                # A torn tail is the last thing in the file; anything after a bad frame is
                # corruption.
                if stop >= end:
                    break
                raise LogCorruptError(
                    f"{path}: frame at byte {pos} fails its checksum ({end - stop} bytes follow)"
                )
            yield pos, payload
            pos = stop
        if torn is not None:
            torn.append(end - pos)


class LogResolver:
    """Entries to reference records, one execution's calls kept per `ExecutionTokens`.

    Only the executions in `executions` are kept (None: all). A legacy entry is converted to
    reference form: a `prompt_base` entry shares its base's whole prompt + completion, a whole
    prompt shares its longest common prefix with its parent (rebuilt on demand, O(prompt)).
    """

    def __init__(self, executions: Collection[str] | None = None) -> None:
        self.executions = executions
        self.tokens: dict[str, ExecutionTokens] = {}
        self.unresolved = 0

    def resolve(self, entry: CallEntry | LegacyCallEntry) -> ModelCall | None:
        """The entry's record, or None when its execution is not kept or its parent is missing
        (counted in `unresolved`)."""
        call = entry.call
        if self.executions is not None and call.execution_id not in self.executions:
            return None
        tokens = self.tokens.setdefault(call.execution_id, ExecutionTokens())
        if isinstance(entry, LegacyCallEntry):
            record = _from_legacy(entry, tokens)
        else:
            record = entry.call
            if record.shared_len and record.parent_call_id not in tokens:
                record = None
        if record is None:
            self.unresolved += 1
            return None
        tokens.add(record)
        return record


def _from_legacy(entry: LegacyCallEntry, tokens: ExecutionTokens) -> ModelCall | None:
    call, base = entry.call, entry.prompt_base
    parent = call.parent_call_id
    fields = {name: getattr(call, name) for name in FullCall.__struct_fields__}
    del fields["prompt_ids"]
    if base is not None:
        if base not in tokens:
            return None
        based = tokens[base]
        shared = based.prompt_len + len(based.completion_ids)
        if base == parent:
            return ModelCall(**fields, shared_len=shared, prompt_tail=call.prompt_ids)
        prompt = tokens.sequence(base) + call.prompt_ids  # never written so; kept exact anyway
    else:
        prompt = call.prompt_ids
    shared = 0
    if parent is not None and parent in tokens:
        shared = common_prefix_len(prompt, tokens.sequence(parent))
    return ModelCall(**fields, shared_len=shared, prompt_tail=prompt[shared:])


def read_log(
    path: str | os.PathLike[str], *, executions: Collection[str] | None = None
) -> LogContents:
    """Rebuild a call log in one streaming pass: the calls (reference form) and summaries of
    `executions` (None: every execution). A torn last frame is skipped and counted in
    `torn_bytes`. Memory: O(the kept executions' tokens), never the whole file.

    Raises LogCorruptError when a frame that is followed by more data is corrupt or does not
    decode, FileNotFoundError when there is no log."""
    out = LogContents()
    resolver = LogResolver(executions)
    torn: list[int] = []
    for pos, payload in iter_frames(path, torn):
        try:
            entry = _DECODER.decode(payload)
        except msgspec.DecodeError as exc:
            raise LogCorruptError(f"{path}: frame at byte {pos} does not decode: {exc}") from None
        if isinstance(entry, EndEntry):
            if executions is None or entry.summary.execution_id in executions:
                out.summaries[entry.summary.execution_id] = entry.summary
            continue
        call = resolver.resolve(entry)
        if call is not None:
            out.calls.append(call)
    out.torn_bytes = torn[0]
    out.unresolved = resolver.unresolved
    return out
