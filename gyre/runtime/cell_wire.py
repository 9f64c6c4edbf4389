"""Wire format of a cell's token-level API: msgspec msgpack bodies and length-prefixed stream frames.

Owns the request/response Structs of the cell API and the frame codec used by `/generate`'s
streamed body (4-byte big-endian length, then one msgpack `Frame`). Shared by the cell server
(asyncio, aiohttp) and the client (anyio, httpx); knows nothing about either.
"""

from __future__ import annotations

import struct

import msgspec

from gyre.engines.protocol import Completion, EngineStatistics, GenerateRequest, KVExport, TokenDelta

__all__ = [
    "AbortRequest",
    "LoadWeightsRequest",
    "ExportKVRequest",
    "ReleaseKVRequest",
    "WireError",
    "Frame",
    "Health",
    "encode",
    "decode",
    "encode_frame",
    "FrameReader",
]


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


class Frame(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One item of a streamed `/generate` body: a delta, or the error that ended the stream."""

    delta: TokenDelta | None = None
    error: WireError | None = None


class Health(msgspec.Struct, frozen=True):
    """`/health`: `starting`, `ready` or `failed` (with the start-up error)."""

    state: str
    error: str | None = None


_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type, msgspec.msgpack.Decoder] = {
    t: msgspec.msgpack.Decoder(t)
    for t in (
        GenerateRequest, AbortRequest, LoadWeightsRequest, WireError, Frame, Health,
        EngineStatistics, list[Completion], ExportKVRequest, ReleaseKVRequest, KVExport, bool,
    )
}
_LEN = struct.Struct(">I")


def encode(obj: object) -> bytes:
    return _encoder.encode(obj)


def decode(data: bytes, type_: type):
    """Decode `data` as `type_`; raises `msgspec.ValidationError` / `DecodeError` on bad input."""
    return _decoders[type_].decode(data)


def encode_frame(frame: Frame) -> bytes:
    body = _encoder.encode(frame)
    return _LEN.pack(len(body)) + body


class FrameReader:
    """Incremental parser of a frame stream: `feed(bytes)` returns the frames completed so far."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if len(self._buf) < 4 + n:
                break
            frames.append(_decoders[Frame].decode(bytes(self._buf[4 : 4 + n])))
            del self._buf[: 4 + n]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still buffered."""
        return len(self._buf)
