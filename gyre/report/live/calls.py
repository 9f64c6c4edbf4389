"""An incremental index of a growing call log, for the live run page.

Owns `CallIndex` and `ExecutionCalls`. `CallIndex.refresh` reads only the frames appended since
the last refresh (the frame format of `gyre.tito.log`: `[u32 length][u32 crc32][msgpack]`), keeps
per execution its call count, tokens, roles, divergence reasons and the byte offsets of its frames,
and `calls_of` rebuilds one execution's `ModelCall`s (reference form) from those offsets with
`read_log`'s rules (`gyre.tito.log.LogResolver`: old logs' whole prompts too). A torn or
half-written last frame is left for the next refresh. Not thread-safe: one worker thread at a time.
Knows nothing about HTTP, trees or training.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from gyre.errors import LogCorruptError
from gyre.tito.log import CallEntry, EndEntry, LegacyCallEntry, LogResolver, decode_entry
from gyre.tito.records import ExecutionSummary, ModelCall

__all__ = ["CallIndex", "ExecutionCalls"]

_HEADER = struct.Struct("<II")
_CHUNK = 8 << 20
"""Bytes read per pass of `refresh` (a huge backlog is read in several passes)."""


@dataclass
class ExecutionCalls:
    """What the log holds about one execution so far."""

    execution_id: str
    calls: int = 0
    prompt_tokens: int = 0
    """Sum of full prompt lengths over calls (a shared prefix counts every time)."""
    completion_tokens: int = 0
    roles: dict[str, int] = field(default_factory=dict)
    """Calls per role (`main`, `main_summary`, `sub_agent`, `sub_agent_summary`)."""
    divergences: dict[str, int] = field(default_factory=dict)
    """Calls per divergence reason (`compaction`, `message_edited`, ...)."""
    untrainable_sampling: bool = False
    """A call sampled greedily or truncated (top-p < 1, top-k > 0): the step trains none of it."""
    first_s: float = 0.0
    last_s: float = 0.0
    summary: ExecutionSummary | None = None
    """Set when the proxy closed the execution."""
    offsets: list[int] = field(default_factory=list)
    """Byte offsets of the execution's call frames, in log order."""
    prompt_len: dict[str, int] = field(default_factory=dict)
    """Full prompt + completion length per call id (to resolve later calls' prompt lengths)."""


class CallIndex:
    """Index of `path` (a call log), brought up to date by `refresh`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.executions: dict[str, ExecutionCalls] = {}
        self.order: list[str] = []
        """Execution ids in order of their first call."""
        self.offset = 0
        """Bytes of the log indexed so far (always at a frame boundary)."""

    def refresh(self) -> bool:
        """Index the frames appended since the last call; returns whether anything was new.
        A missing log is an empty one. Raises `LogCorruptError` when a bad frame is followed by
        more data (a torn tail is waited on instead)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return False
        if size < self.offset:
            raise LogCorruptError(f"{self.path}: the log shrank from {self.offset} to {size} bytes")
        changed = False
        with open(self.path, "rb") as f:
            while self.offset < size:
                f.seek(self.offset)
                data = f.read(min(_CHUNK, size - self.offset))
                used = self._scan(data, size)
                if used == 0:
                    if len(data) >= size - self.offset:
                        break  # an incomplete last frame: wait for the writer
                    f.seek(self.offset)  # one frame larger than a chunk
                    data = f.read(size - self.offset)
                    used = self._scan(data, size)
                    if used == 0:
                        break
                self.offset += used
                changed = True
        return changed

    def _scan(self, data: bytes, size: int) -> int:
        pos, end = 0, len(data)
        while end - pos >= _HEADER.size:
            length, crc = _HEADER.unpack_from(data, pos)
            start, stop = pos + _HEADER.size, pos + _HEADER.size + length
            if stop > end:
                break
            if zlib.crc32(data[start:stop]) != crc:
                if self.offset + stop >= size:
                    break  # torn by a writer killed mid-frame, or not yet whole
                raise LogCorruptError(
                    f"{self.path}: frame at byte {self.offset + pos} fails its checksum"
                )
            entry = decode_entry(data[start:stop])
            self._add(entry, self.offset + pos)
            pos = stop
        return pos

    def _execution(self, execution_id: str) -> ExecutionCalls:
        ex = self.executions.get(execution_id)
        if ex is None:
            ex = self.executions[execution_id] = ExecutionCalls(execution_id)
            self.order.append(execution_id)
        return ex

    def _add(self, entry: CallEntry | LegacyCallEntry | EndEntry, offset: int) -> None:
        if isinstance(entry, EndEntry):
            self._execution(entry.summary.execution_id).summary = entry.summary
            return
        call = entry.call
        ex = self._execution(call.execution_id)
        if isinstance(entry, LegacyCallEntry):
            prompt = len(entry.call.prompt_ids)
            if entry.prompt_base is not None:
                prompt += ex.prompt_len.get(entry.prompt_base, 0)
        else:
            prompt = entry.call.prompt_len
        ex.prompt_len[call.call_id] = prompt + len(call.completion_ids)
        ex.calls += 1
        ex.prompt_tokens += prompt
        ex.completion_tokens += len(call.completion_ids)
        ex.roles[call.role] = ex.roles.get(call.role, 0) + 1
        sp = call.sampling
        if sp.temperature == 0 or sp.top_p < 1 or sp.top_k > 0 or sp.min_p > 0:
            ex.untrainable_sampling = True
        if call.divergence is not None:
            reason = call.divergence.reason
            ex.divergences[reason] = ex.divergences.get(reason, 0) + 1
        ex.first_s = call.started_s if ex.calls == 1 else min(ex.first_s, call.started_s)
        ex.last_s = max(ex.last_s, call.finished_s)
        ex.offsets.append(offset)

    def calls_of(self, execution_id: str) -> list[ModelCall]:
        """The execution's calls indexed so far, in reference form (as `read_log` rebuilds
        them). Raises `KeyError` for an execution the index has not seen."""
        ex = self.executions[execution_id]
        resolver = LogResolver()
        out: list[ModelCall] = []
        with open(self.path, "rb") as f:
            for offset in ex.offsets:
                f.seek(offset)
                length, _crc = _HEADER.unpack(f.read(_HEADER.size))
                entry = decode_entry(f.read(length))
                assert not isinstance(entry, EndEntry)
                call = resolver.resolve(entry)
                if call is not None:  # as read_log: a call whose parent is missing is skipped
                    out.append(call)
        return out
