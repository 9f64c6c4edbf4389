"""Sealed reasoning: the Responses API's `encrypted_content`, issued and checked by one proxy.

Owns `ReasoningSeal` and `SealError`. A stateless client (`store: false`, `include:
["reasoning.encrypted_content"]`, Codex-style) carries a response's reasoning item back itself,
often without its text; the seal lets the proxy restore exactly the reasoning the model sampled.
A seal is `gyre.r1.<payload>.<mac>` (unpadded URL-safe base64): the payload is the JSON of the
execution, the response and the reasoning text; the MAC is HMAC-SHA256 over it with a key of 32
random bytes drawn once per seal (so per proxy: a restarted proxy refuses older seals). It is
authenticated, not encrypted: the text is the reasoning the response already shows. A seal
opens only for the execution it was issued to, so one execution cannot replay another's. Knows
nothing about HTTP, requests or the chat path.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

import msgspec

__all__ = ["ReasoningSeal", "SealError"]

_PREFIX = "gyre.r1."
_DOMAIN = b"gyre reasoning seal v1\0"
"""What the MAC covers before the payload: a seal is never valid as another MAC of this key."""


class SealError(ValueError):
    """A seal that does not open: altered, not issued by this proxy, or another execution's."""


class _Sealed(msgspec.Struct, frozen=True, array_like=True):
    execution_id: str
    response_id: str
    text: str


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(_Sealed)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """Canonical unpadded URL-safe base64, as `_b64` writes it (binascii.Error otherwise: a
    seal has exactly one spelling, so no altered character goes unnoticed)."""
    if not text.isascii():
        raise binascii.Error("not base64")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise binascii.Error("not canonical base64")
    return raw


class ReasoningSeal:
    """Seals reasoning texts to an execution and opens them again.

    Args:
        key: the MAC key; None draws 32 random bytes (`secrets.token_bytes`).
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = secrets.token_bytes(32) if key is None else key
        if len(self._key) < 32:
            raise ValueError(f"key of {len(self._key)} bytes: a seal key needs at least 32")

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, _DOMAIN + payload, hashlib.sha256).digest()

    def seal(self, execution_id: str, response_id: str, text: str) -> str:
        """The `encrypted_content` of reasoning `text` of response `response_id`."""
        payload = _ENCODER.encode(_Sealed(execution_id, response_id, text))
        return f"{_PREFIX}{_b64(payload)}.{_b64(self._mac(payload))}"

    def open(self, sealed: str, execution_id: str) -> tuple[str, str]:
        """(response ID, reasoning text) of a seal issued to `execution_id`. Raises SealError
        for one that is altered or not this proxy's, or was issued to another execution."""
        body = sealed.removeprefix(_PREFIX) if isinstance(sealed, str) else ""
        payload_b64, _, mac_b64 = body.partition(".")
        try:
            if body == sealed or not mac_b64:
                raise binascii.Error("not a seal")
            payload, mac = _unb64(payload_b64), _unb64(mac_b64)
        except binascii.Error:
            raise SealError("is not a seal this proxy issued") from None
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise SealError("was altered or not issued by this proxy")
        got = _DECODER.decode(payload)  # authentic: written by `seal`
        if got.execution_id != execution_id:
            raise SealError("was issued to another execution")
        return got.response_id, got.text
