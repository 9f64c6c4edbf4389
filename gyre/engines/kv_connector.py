"""KV-cache exports between vLLM engines on a shared folder: `GyreKVConnector` and its store.

Owns the shared store's layout and rules, used by the connector (inside vLLM's engine-core and
worker processes) and by `VLLMEngine.export_kv` / `release_kv`:

- an export of a token sequence of length L is the KV of its first `(L - 1) // block * block`
  tokens, one safetensors file per layer under `<shared_dir>/<key>/` (vLLM's ExampleConnector
  format), where `key` is the MD5 of those token IDs as int64; a `complete` marker written after
  the export request finished makes it loadable, so a half-written export is never read;
- `GyreKVConnector` (an `ExampleConnector`) stores only requests marked `{"gyre_export": True}` in
  their `kv_transfer_params`, never ordinary prompts (stale KV after a weight load, unbounded
  growth), and loads for any new request whose prompt has a complete export under its key;
- exports older than the lease are deleted by `sweep`;
- an export deleted after the scheduler chose to load it is reported as failed blocks, which
  vLLM recomputes (the engine sets `kv_load_failure_policy="recompute"`).

Knows nothing about requests, routing or HTTP; the engine must not chunk a storing prefill.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)

__all__ = [
    "GyreKVConnector",
    "EXPORT_PARAM",
    "COMPLETE",
    "export_key",
    "export_bytes",
    "mark_complete",
    "release",
    "sweep",
]

logger = logging.getLogger(__name__)

EXPORT_PARAM = "gyre_export"
"""`kv_transfer_params` flag of a request whose prompt the connector stores."""
COMPLETE = "complete"
"""Marker file of an export that may be loaded."""
_KEY = re.compile(r"[0-9a-f]{32,64}")


def export_key(token_ids: list[int], block_size: int) -> tuple[str, int]:
    """(key, tokens stored) of the export of `token_ids`: the leading whole blocks that leave at
    least one token for the loading engine to compute. tokens is 0 when the sequence is too short."""
    n = (len(token_ids) - 1) // block_size * block_size
    data = np.asarray(token_ids[:n], dtype=np.int64).tobytes()  # ExampleConnector hashes int64 tensors
    try:
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
    except ValueError:  # FIPS builds: vLLM's safe_hash falls back the same way
        digest = hashlib.sha256(data).hexdigest()
    return digest, max(n, 0)


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
    """Make export `key` loadable (atomic rename); raises `FileNotFoundError` if nothing was stored."""
    folder = _folder(shared_dir, key)
    if not any(f.suffix == ".safetensors" for f in folder.iterdir()):
        raise FileNotFoundError(f"export {key} holds no KV files in {folder}")
    tmp = folder / f".{COMPLETE}.{os.getpid()}"
    tmp.write_text(f"{weight_version}\n")
    os.replace(tmp, folder / COMPLETE)


def release(shared_dir: str | Path, key: str) -> bool:
    """Delete export `key`; False if it was already gone. Raises `ValueError` for a malformed key."""
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


class GyreKVConnector(ExampleConnector):
    """ExampleConnector that stores only marked requests and loads only complete exports.

    Scheduler side: `get_num_new_matched_tokens` decides store (marked) or load (complete export of
    the prompt's key); `build_connector_meta` hands the worker what to store or load. Worker side:
    ExampleConnector's file I/O (its load skipped on steps with nothing to load).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store_ids: set[str] = set()
        self._failed_blocks: set[int] = set()

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        params = request.kv_transfer_params or {}
        if params.get(EXPORT_PARAM):
            self._store_ids.add(request.request_id)
            return 0, False
        key, n = export_key(list(request.prompt_token_ids or []), self._block_size)
        if n <= num_computed_tokens or not os.path.exists(os.path.join(self._storage_path, key, COMPLETE)):
            return 0, False
        return n - num_computed_tokens, False

    def build_connector_meta(self, scheduler_output: Any) -> ExampleConnectorMetadata:
        meta = ExampleConnectorMetadata()
        for new_req in scheduler_output.scheduled_new_reqs:
            token_ids = list(new_req.prompt_token_ids or [])
            if new_req.req_id in self._requests_need_load:
                meta.add_request(token_ids, new_req.block_ids[0], self._block_size, is_store=False, mm_hashes=[])
            elif new_req.req_id in self._store_ids:
                self._store_ids.discard(new_req.req_id)
                meta.add_request(token_ids, new_req.block_ids[0], self._block_size, is_store=True, mm_hashes=[])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):  # a loading request resumed after preemption
            if req_id not in cached.resumed_req_ids or req_id not in self._requests_need_load:
                continue
            request = self._requests_need_load[req_id]
            total = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            meta.add_request(
                request.all_token_ids[:total], cached.new_block_ids[i][0], self._block_size,
                is_store=False, mm_hashes=[],
            )
        self._requests_need_load.clear()
        return meta

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Load this step's exports. One deleted between the scheduler's check and this load
        (released after an earlier attempt with the same key, or swept) must not kill the engine:
        its requests' blocks are reported failed and vLLM recomputes them
        (`kv_load_failure_policy="recompute"`)."""
        metadata = self._get_connector_metadata()
        loads = [r for r in metadata.requests if not r.is_store]
        if not loads:  # else ExampleConnector warns every step
            return
        try:
            super().start_load_kv(forward_context, **kwargs)
        except FileNotFoundError as exc:
            logger.warning("KV export gone while loading (%s): its blocks are recomputed", exc)
            for r in loads:
                self._failed_blocks.update(int(b) for b in (r.slot_mapping // self._block_size).unique().tolist())

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose export vanished during `start_load_kv` since the last call."""
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._store_ids.discard(request.request_id)  # a marked request aborted before it was scheduled
        return False, None
