"""The KV transport seam without vLLM: each transport driven by a scripted `KVHost`.

The host stands in for `VLLMEngine`: its export request writes what vLLM's connector would (a
layer file in the export's folder) or returns the handle NixlConnector would. The real engines
are covered by `test_vllm_kv_migration.py` (slow).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from gyre.config import EngineConfig, KVTransferConfig
from gyre.engines import kv_folder
from gyre.engines.kv_transport import FolderTransport, NixlTransport, NoKVTransport, kv_transport
from gyre.errors import EngineError, EngineUnavailableError, InvalidRequestError

BLOCK = 16


class ScriptedHost:
    """A `KVHost`: records export requests; `store` writes a layer file like ExampleConnector."""

    def __init__(self, shared_dir: Path | None = None, handle: dict[str, Any] | None = None) -> None:
        self.weight_version = 3
        self.shared_dir = shared_dir
        self.handle = handle
        self.requests: list[tuple[list[int], dict[str, Any]]] = []
        self.bump_version = False

    async def wait_ready(self) -> None:
        return None

    async def run_export_request(self, token_ids: list[int], kv_transfer_params: dict[str, Any]):
        self.requests.append((list(token_ids), dict(kv_transfer_params)))
        if self.shared_dir is not None:
            key, _ = kv_folder.export_key(token_ids, BLOCK)
            (self.shared_dir / key).mkdir(parents=True, exist_ok=True)
            (self.shared_dir / key / "layer0.safetensors").write_bytes(b"x" * 100)
        if self.bump_version:
            self.weight_version += 1
        return "gyre-export-1", self.handle


def config(connector: str, shared_dir: Path | str = "/dev/shm/unused") -> EngineConfig:
    return EngineConfig(
        block_size=BLOCK, max_model_len=256,
        kv_transfer=KVTransferConfig(connector=connector, shared_dir=str(shared_dir), lease_s=60.0),
    )


def test_factory_picks_one_transport_per_connector() -> None:
    kinds = {c: type(kv_transport(config(c))) for c in ("none", "example", "nixl")}
    assert kinds == {"none": NoKVTransport, "example": FolderTransport, "nixl": NixlTransport}
    assert kv_transport(config("none")).engine_args() == {}


def test_none_refuses_export_and_release() -> None:
    kv = NoKVTransport(config("none"))
    with pytest.raises(EngineUnavailableError, match="export_kv needs engine.kv_transfer.connector"):
        kv.check_export(list(range(40)), max_model_len=256)
    with pytest.raises(EngineUnavailableError, match="release_kv needs"):
        asyncio.run(kv.release("ab" * 16))


@pytest.mark.parametrize("n, error", [(BLOCK, "at least block_size \\+ 1 = 17"), (256, "must be < max_model_len=256")])
def test_check_export_bounds(n: int, error: str) -> None:
    kv = FolderTransport(config("example"))
    with pytest.raises(InvalidRequestError, match=error):
        kv.check_export(list(range(n)), max_model_len=256)
    kv.check_export(list(range(BLOCK + 1)), max_model_len=256)  # one block + 1 token: fine


def test_folder_export_marks_complete_refreshes_and_releases(tmp_path: Path) -> None:
    kv = FolderTransport(config("example", tmp_path))
    host = ScriptedHost(tmp_path)
    ids = list(range(10, 10 + 2 * BLOCK + 5))  # 37 tokens: 2 whole blocks stored

    export = asyncio.run(kv.export(host, ids))
    # bytes: the 100-byte layer file + the 2-byte `complete` marker ("3\n")
    assert (export.tokens, export.sequence_tokens, export.bytes, export.weight_version) == (32, 37, 102, 3)
    assert export.key == kv_folder.export_key(ids, BLOCK)[0] and export.transfer_params is None
    assert host.requests == [(ids, {kv_folder.EXPORT_PARAM: True})]
    assert (tmp_path / export.key / kv_folder.COMPLETE).read_text() == "3\n"
    assert kv.import_params(export) is None  # found by its tokens

    again = asyncio.run(kv.export(host, ids))  # complete already: no second request
    assert len(host.requests) == 1 and again.key == export.key

    assert asyncio.run(kv.release(export.key)) is True
    assert asyncio.run(kv.release(export.key)) is False
    assert not (tmp_path / export.key).exists()
    with pytest.raises(InvalidRequestError, match="not an export key"):
        asyncio.run(kv.release("../etc"))
    stats = kv.statistics()
    assert (stats.exports, stats.tokens_exported, stats.released, stats.expired) == (2, 64, 1, 0)


def test_folder_export_across_a_weight_load_is_refused_and_deleted(tmp_path: Path) -> None:
    kv = FolderTransport(config("example", tmp_path))
    host = ScriptedHost(tmp_path)
    host.bump_version = True
    ids = list(range(40))
    with pytest.raises(EngineUnavailableError, match="weights changed from version 3 to 4"):
        asyncio.run(kv.export(host, ids))
    assert not (tmp_path / kv_folder.export_key(ids, BLOCK)[0]).exists()
    assert kv.statistics().exports == 0


def test_folder_export_that_stored_nothing_fails(tmp_path: Path) -> None:
    kv = FolderTransport(config("example", tmp_path))
    host = ScriptedHost(None)  # the request ran but the connector wrote no file
    ids = list(range(40))
    os.makedirs(tmp_path / kv_folder.export_key(ids, BLOCK)[0])
    with pytest.raises(EngineError, match="stored nothing"):
        asyncio.run(kv.export(host, ids))


def test_nixl_export_hands_over_the_pull_handle() -> None:
    handle = {"remote_request_id": "r-7", "remote_block_ids": [[1, 2]], "remote_prefill_cached_tokens": 5}
    kv = NixlTransport(config("nixl"))
    host = ScriptedHost(handle=handle)
    export = asyncio.run(kv.export(host, list(range(40))))
    assert (export.key, export.tokens, export.sequence_tokens, export.bytes) == ("r-7", 39, 40, 0)
    assert export.transfer_params == {"remote_request_id": "r-7", "remote_block_ids": [[1, 2]]}
    assert host.requests[0][1] == {"do_remote_decode": True}
    assert kv.import_params(export) == export.transfer_params
    assert asyncio.run(kv.release(export.key)) is False
    assert (kv.statistics().exports, kv.statistics().tokens_exported) == (1, 39)


def test_nixl_export_without_a_handle_fails() -> None:
    kv = NixlTransport(config("nixl"))
    with pytest.raises(EngineError, match="kept no blocks for 40 tokens"):
        asyncio.run(kv.export(ScriptedHost(handle=None), list(range(40))))
