"""vLLM's ExampleConnector for gyre's KV migration on a shared folder: `GyreKVConnector`.

vLLM loads it from here (`kv_connector_module_path="gyre.engines.kv_connector"`) inside its
engine-core and worker processes. It stores only requests marked `{"gyre_export": True}` in their
`kv_transfer_params`, never ordinary prompts (stale KV after a weight load, unbounded growth), and
loads only for requests marked `{"gyre_import": True}` whose prompt has a complete export under
its key. Both marks carry the weight version (`gyre_weight_version`), which is part of the key, so
KV is loaded only into a request of the version that computed it (the engine marks an import only
when its own version matches); the folder's layout and rules are `gyre.engines.kv_folder`. An
export deleted after the scheduler chose to load it is reported as failed blocks, which vLLM
recomputes (the engine sets `kv_load_failure_policy="recompute"`).

Knows nothing about gyre's requests, routing or HTTP; the engine must not chunk a storing prefill.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)

from gyre.engines.kv_folder import (
    COMPLETE,
    EXPORT_PARAM,
    IMPORT_PARAM,
    VERSION_PARAM,
    export_key,
    version_salt,
)

__all__ = ["GyreKVConnector"]

logger = logging.getLogger(__name__)


class GyreKVConnector(ExampleConnector):
    """ExampleConnector that stores only marked requests and loads only complete exports.

    Scheduler side: `get_num_new_matched_tokens` decides store (marked for export) or load
    (marked for import, with a complete export under the key of its prompt and version);
    `build_connector_meta` hands the worker what to store or load, the version's salt as the
    request's `mm_hashes` (ExampleConnector hashes it into the folder name). Worker side:
    ExampleConnector's file I/O (its load skipped on steps with nothing to load).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store_versions: dict[str, int] = {}  # request ID -> weight version of its export
        self._failed_blocks: set[int] = set()

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        params = request.kv_transfer_params or {}
        if params.get(EXPORT_PARAM):
            self._store_versions[request.request_id] = int(params[VERSION_PARAM])
            return 0, False
        if not params.get(IMPORT_PARAM):
            return 0, False
        prompt = list(request.prompt_token_ids or [])
        key, n = export_key(prompt, self._block_size, int(params[VERSION_PARAM]))
        complete = os.path.join(self._storage_path, key, COMPLETE)
        if n <= num_computed_tokens or not os.path.exists(complete):
            return 0, False
        return n - num_computed_tokens, False

    def build_connector_meta(self, scheduler_output: Any) -> ExampleConnectorMetadata:
        meta = ExampleConnectorMetadata()
        for new_req in scheduler_output.scheduled_new_reqs:
            token_ids = list(new_req.prompt_token_ids or [])
            blocks, size = new_req.block_ids[0], self._block_size
            if new_req.req_id in self._requests_need_load:
                salt = _salt(self._requests_need_load[new_req.req_id])
                meta.add_request(token_ids, blocks, size, is_store=False, mm_hashes=salt)
            elif new_req.req_id in self._store_versions:
                salt = [version_salt(self._store_versions.pop(new_req.req_id))]
                meta.add_request(token_ids, blocks, size, is_store=True, mm_hashes=salt)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):  # a loading request resumed after preemption
            if req_id not in cached.resumed_req_ids or req_id not in self._requests_need_load:
                continue
            request = self._requests_need_load[req_id]
            total = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            meta.add_request(
                request.all_token_ids[:total],
                cached.new_block_ids[i][0],
                self._block_size,
                is_store=False,
                mm_hashes=_salt(request),
            )
        self._requests_need_load.clear()
        return meta

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Load this step's exports. One deleted between the scheduler's check and this load
        (released after an earlier attempt with the same key, or swept) must not kill the engine:
        its requests' blocks are reported failed and vLLM recomputes them
        (`kv_load_failure_policy="recompute"`)."""
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, ExampleConnectorMetadata)  # built by build_connector_meta
        loads = [r for r in metadata.requests if not r.is_store]
        if not loads:  # else ExampleConnector warns every step
            return
        try:
            super().start_load_kv(forward_context, **kwargs)
        except FileNotFoundError as exc:
            logger.warning("KV export gone while loading (%s): its blocks are recomputed", exc)
            for r in loads:
                self._failed_blocks.update(
                    int(b) for b in (r.slot_mapping // self._block_size).unique().tolist()
                )

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose export vanished during `start_load_kv` since the last call."""
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._store_versions.pop(request.request_id, None)  # aborted before it was scheduled
        return False, None


def _salt(request: Any) -> list[str]:
    """The `mm_hashes` of an importing request: its weight version's salt (`version_salt`)."""
    return [version_salt(int(request.kv_transfer_params[VERSION_PARAM]))]
