"""Wire format of a cell's token-level API: msgspec msgpack bodies and length-prefixed stream
frames.

Owns the request/response Structs of the cell API and the frame codec of `/stream`, the
long-lived body that carries every request's deltas (4-byte big-endian length, then one msgpack
`FrameBatch`: the `Frame`s of one engine step, each tagged with the client's tag). numpy arrays
(the fields of `PackedBatch`) cross as `[dtype.str, shape, raw bytes]` and decode to an equal
array (same dtype, shape and bytes). Also owns the node's cell secret (`cell_secret`), the bearer
token every request to a cell carries. Shared by the cell server (asyncio, aiohttp) and the
client (anyio, httpx); knows nothing about either.
"""

from __future__ import annotations

import os
import secrets
import struct
from typing import Any, Literal

import msgspec
import numpy as np

from gyre.engines.protocol import (
    AccumulateStatistics,
    Completion,
    EngineStatistics,
    GenerateRequest,
    KVExport,
    TokenDelta,
)
from gyre.trajectory.pack import PackedBatch

__all__ = [
    "CellRole",
    "CELL_SECRET_ENV",
    "cell_secret",
    "auth_headers",
    "AbortRequest",
    "LoadWeightsRequest",
    "ExportKVRequest",
    "ReleaseKVRequest",
    "WireError",
    "Frame",
    "FrameBatch",
    "StreamedGenerate",
    "Health",
    "SwitchRequest",
    "SwitchResult",
    "TrainRequest",
    "SendGradientsRequest",
    "ReceiveGradientsRequest",
    "StepRequest",
    "StepResult",
    "CheckpointRequest",
    "CellStatistics",
    "encode",
    "decode",
    "encode_frame",
    "FrameReader",
    "merge_deltas",
]

CellRole = Literal["rollout", "train", "switching"]
"""A cell's role (docs/design.md terms); `switching` lasts from the switch order to its
completion."""

CELL_SECRET_ENV = "GYRE_CELL_SECRET"
"""The environment variable holding the node's cell secret: every request to a cell carries it
(`Authorization: Bearer <secret>`), so an agent on the node, which can reach the cells' loopback
ports, cannot drive them (`/load_checkpoint` loads a file as root)."""


def cell_secret() -> str:
    """This node's cell secret: `$GYRE_CELL_SECRET`, set in this process's environment on first
    use (`secrets.token_hex(32)`: 64 hex characters), so the cells it starts inherit it. Agents
    never hold it: the harness passes them only PATH, LANG, LC_ALL and TZ, and another uid cannot
    read a root process's /proc/<pid>/environ. Several nodes sharing cells set the same value."""
    return os.environ.setdefault(CELL_SECRET_ENV, secrets.token_hex(32))


def auth_headers() -> dict[str, str]:
    """The headers every request to a cell carries: `Authorization: Bearer <cell_secret()>`."""
    return {"Authorization": f"Bearer {cell_secret()}"}


class AbortRequest(msgspec.Struct, frozen=True):
    request_id: str


class LoadWeightsRequest(msgspec.Struct, frozen=True):
    snapshot: str
    """Hugging Face folder with the new weights (safetensors)."""
    version: int


class ExportKVRequest(msgspec.Struct, frozen=True):
    token_ids: list[int]
    """The sequence (prompt + tokens so far) whose KV the cell stores (`export_kv`)."""


class ReleaseKVRequest(msgspec.Struct, frozen=True):
    key: str
    """`KVExport.key` of the export to delete."""


class WireError(msgspec.Struct, frozen=True):
    """An error crossing the wire: `code` is a `gyre.errors` class code (see `error_from_code`)."""

    code: str
    message: str


class StreamedGenerate(msgspec.Struct, frozen=True, kw_only=True):
    """One request of a `POST /generate` batch (a list of them): run `request`, streaming its
    deltas on the client's open `/stream` `stream`, each `Frame` tagged `tag` (unique per stream;
    request IDs may repeat)."""

    stream: str
    tag: int
    request: GenerateRequest


class Frame(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One item of the delta stream: a delta of request `tag`, or the error that ended it."""

    delta: TokenDelta | None = None
    error: WireError | None = None
    tag: int = 0


class FrameBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One write of `/stream`: the frames that became ready together (one engine step), in order."""

    frames: list[Frame]


class Health(msgspec.Struct, frozen=True):
    """`/health`: `starting`, `ready` or `failed` (with the start-up error), the cell's role and
    its trainer's weight version (None without a trainer)."""

    state: str
    error: str | None = None
    role: CellRole = "rollout"
    trainer_version: int | None = None


class SwitchRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`/switch`: change role to `rollout` or `train`. `snapshot`: Hugging Face folder to load
    (into the trainer going to `train`, a satellite; into the engine going to `rollout`, when
    `version` differs from the engine's); None keeps the weights in place."""

    role: str
    snapshot: str | None = None
    version: int = 0


class SwitchResult(msgspec.Struct, frozen=True, kw_only=True):
    seconds: float
    """Wall time of the switch inside the cell (0 when already in that role)."""


class TrainRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`/train`: accumulate the gradients of these micro-batches (no step)."""

    micro_batches: list[PackedBatch]
    advantages: dict[str, float | None]
    """Advantage per execution id (None: no loss); every execution of the micro-batches needs
    one."""


class SendGradientsRequest(msgspec.Struct, frozen=True, kw_only=True):
    dst: int
    """Gradient-group rank of the core cell."""


class ReceiveGradientsRequest(msgspec.Struct, frozen=True, kw_only=True):
    src: int
    """Gradient-group rank of the satellite cell."""


class StepRequest(msgspec.Struct, frozen=True, kw_only=True):
    snapshot_root: str
    """Folder under which an applied step's weights are saved as `v<version>`."""


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """What `/step` did."""

    version: int
    """Trainer weight version after the step (bumped only when applied)."""
    applied: bool
    """False when a non-finite loss or gradient skipped the step."""
    grad_norm: float | None
    """Global gradient norm before clipping (None when skipped or not reported: ZeRO 0)."""
    snapshot: str | None
    """The saved snapshot folder (None when skipped)."""


class CheckpointRequest(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    """DeepSpeed checkpoint folder (weights, optimizer state, version)."""


class CellStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /cell_statistics`: the cell's role side (docs/style.md rule 6)."""

    role: CellRole
    """`rollout`, `train` or `switching` (between the two; refuses work)."""
    trainer_version: int | None
    """The trainer's weight version (None: no trainer)."""
    has_gradients: bool
    """The trainer holds gradients no step or send consumed yet."""
    switches: int
    """Completed role switches since start."""
    last_switch_s: float | None
    """Wall seconds of the last completed switch."""
    requests_aborted_by_switch: int
    """In-flight generate requests aborted by switches to `train`."""
    group_rank: int | None
    """Rank in the run-wide gradient group (None: no group)."""
    gradients_sent: int
    gradients_received: int
    micro_batches_trained: int
    steps_applied: int
    streams_open: int = 0
    """Clients' delta streams (`/stream`) open now."""
    stream_writes: int = 0
    """`FrameBatch` writes on all delta streams since start."""
    stream_frames: int = 0
    """Frames in those writes (`stream_frames / stream_writes`: requests served per write)."""
    generate_posts: int = 0
    """`POST /generate` batches received since start."""
    generate_requests: int = 0
    """Requests in them (`generate_requests / generate_posts`: requests per post)."""


def _enc_hook(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        return (obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes())
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(type_: type, obj: Any) -> object:  # obj: any decoded value, checked below
    if type_ is np.ndarray:
        try:
            dtype, shape, data = obj
            return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
        except (TypeError, ValueError) as exc:
            raise msgspec.ValidationError(f"bad array {type(obj).__name__}: {exc}") from None
    raise NotImplementedError(f"cannot decode {type_}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoders: dict[type, msgspec.msgpack.Decoder] = {
    t: msgspec.msgpack.Decoder(t, dec_hook=_dec_hook)
    for t in (
        GenerateRequest,
        StreamedGenerate,
        list[StreamedGenerate],
        FrameBatch,
        AbortRequest,
        LoadWeightsRequest,
        WireError,
        Frame,
        Health,
        EngineStatistics,
        list[Completion],
        ExportKVRequest,
        ReleaseKVRequest,
        KVExport,
        bool,
        SwitchRequest,
        SwitchResult,
        TrainRequest,
        SendGradientsRequest,
        ReceiveGradientsRequest,
        StepRequest,
        StepResult,
        CheckpointRequest,
        CellStatistics,
        AccumulateStatistics,
        PackedBatch,
    )
}
_LEN = struct.Struct(">I")


def encode(obj: object) -> bytes:
    return _encoder.encode(obj)


def decode(data: bytes, type_: type):
    """Decode `data` as `type_`; raises `msgspec.ValidationError` / `DecodeError` on bad input."""
    return _decoders[type_].decode(data)


def encode_frame(frame: Frame | FrameBatch) -> bytes:
    body = _encoder.encode(frame)
    return _LEN.pack(len(body)) + body


def merge_deltas(deltas: list[TokenDelta]) -> list[TokenDelta]:
    """`deltas` (of one request, in stream order) with the consecutive deltas of each choice
    merged into one: its token IDs, logprobs and versions concatenated (so every token keeps the
    weight version that sampled it), top-k lists concatenated where present (a delta without them,
    such as an empty final one, adds none), `finish_reason` that of the last delta merged and
    `cached_tokens` the last one set. A merge never crosses a choice's finish: a delta of a choice
    after its finish starts a new one. Choices keep the order of their first delta; a choice's own
    deltas are never reordered. O(total tokens); a single delta is returned as it is."""
    if len(deltas) < 2:
        return list(deltas)
    groups: list[list[TokenDelta]] = []
    open_groups: dict[int, list[TokenDelta]] = {}
    for delta in deltas:
        group = open_groups.get(delta.index)
        if group is None:
            group = open_groups[delta.index] = []
            groups.append(group)
        group.append(delta)
        if delta.finish_reason is not None:
            del open_groups[delta.index]
    return [group[0] if len(group) == 1 else _concat(group) for group in groups]


def _concat(group: list[TokenDelta]) -> TokenDelta:
    last = group[-1]
    top = any(d.top_ids is not None for d in group)
    return TokenDelta(
        index=last.index,
        token_ids=[t for d in group for t in d.token_ids],
        logprobs=[lp for d in group for lp in d.logprobs],
        versions=[v for d in group for v in d.versions],
        finish_reason=last.finish_reason,
        cached_tokens=next(
            (d.cached_tokens for d in reversed(group) if d.cached_tokens is not None), None
        ),
        top_ids=[k for d in group for k in d.top_ids or ()] if top else None,
        top_logprobs=[k for d in group for k in d.top_logprobs or ()] if top else None,
    )


class FrameReader:
    """Incremental parser of a frame stream: `feed(bytes)` returns the frames (of `type_`, a
    `Frame` or a `FrameBatch`) completed so far."""

    def __init__(self, type_: type = Frame) -> None:
        self._buf = bytearray()
        self._decoder = _decoders[type_]

    def feed(self, data: bytes) -> list:
        self._buf += data
        frames, at, end = [], 0, len(self._buf)
        while end - at >= 4:
            (n,) = _LEN.unpack_from(self._buf, at)
            if end - at < 4 + n:
                break
            frames.append(self._decoder.decode(self._buf[at + 4 : at + 4 + n]))
            at += 4 + n
        del self._buf[:at]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still buffered."""
        return len(self._buf)
