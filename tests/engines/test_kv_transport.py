"""The KV transport seam without vLLM: each transport driven by a scripted `KVHost`.

The host stands in for `VLLMEngine`: its export request writes what vLLM's connector would (a
layer file in the export's folder) or returns the handle NixlConnector would. Every export carries
the weight version that computed it, and is loaded only into a request of that version (issue 18).
The real engines are covered by `test_vllm_kv_migration.py` (slow).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gyre.config import EngineConfig, KVTransferConfig
from gyre.engines import kv_folder
from gyre.engines.kv_transport import (
    FolderTransport,
    NixlTransport,
    NoKVTransport,
    cell_kv_config,
    kv_transport,
    open_kv_folder,
)
from gyre.errors import ConfigError, EngineError, EngineUnavailableError, InvalidRequestError

BLOCK = 16


class ScriptedHost:
    """A `KVHost`: records export requests; `store` writes a layer file like ExampleConnector."""

    def __init__(
        self, shared_dir: Path | None = None, handle: dict[str, Any] | None = None
    ) -> None:
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
            version = kv_transfer_params[kv_folder.VERSION_PARAM]
            key, _ = kv_folder.export_key(token_ids, BLOCK, version)
            (self.shared_dir / key).mkdir(parents=True, exist_ok=True)
            (self.shared_dir / key / "layer0.safetensors").write_bytes(b"x" * 100)
        if self.bump_version:
            self.weight_version += 1
        return "gyre-export-1", self.handle


def config(connector: str, shared_dir: Path | str | None = None) -> EngineConfig:
    """An engine config with `connector`; `example`'s folder is `shared_dir` (default: one never
    written to)."""
    if connector == "example" and shared_dir is None:
        shared_dir = "/dev/shm/unused"
    return EngineConfig(
        block_size=BLOCK,
        max_model_len=256,
        kv_transfer=KVTransferConfig(
            connector=connector, shared_dir=str(shared_dir or ""), lease_s=60.0
        ),
    )


def test_factory_picks_one_transport_per_connector() -> None:
    kinds = {c: type(kv_transport(config(c))) for c in ("none", "example", "nixl")}
    assert kinds == {"none": NoKVTransport, "example": FolderTransport, "nixl": NixlTransport}
    assert kv_transport(config("none")).engine_args() == {}


def test_migration_is_on_by_default_in_a_folder_of_each_runs_own(tmp_path: Path) -> None:
    default = EngineConfig().kv_transfer
    assert (default.connector, default.shared_dir) == ("example", "")
    with open_kv_folder(EngineConfig()) as one, open_kv_folder(EngineConfig()) as two:
        a, b = Path(one.kv_transfer.shared_dir), Path(two.kv_transfer.shared_dir)
        assert a != b and a.is_dir() and b.is_dir()  # two runs never share a folder
        assert a.name.startswith(kv_folder.RUN_FOLDER_PREFIX) and a.parent == Path("/dev/shm")
        assert os.stat(a).st_mode & 0o777 == 0o700
        (a / ("0" * 32)).mkdir()  # an export left behind
        assert one.kv_transfer.connector == "example" and one.max_model_len == 4096
    assert not a.exists() and not b.exists()  # removed with what they held
    with pytest.raises(RuntimeError, match="the run failed"):
        with open_kv_folder(EngineConfig()) as failing:
            c = Path(failing.kv_transfer.shared_dir)
            assert c.is_dir()
            raise RuntimeError("the run failed")
    assert not c.exists()  # removed on an error too
    with open_kv_folder(EngineConfig(), tmp_path) as shared:  # cells on several hosts: run_dir
        assert Path(shared.kv_transfer.shared_dir).parent == tmp_path
    assert list(tmp_path.iterdir()) == []


_OWNER = """
import sys, time
from gyre.engines import kv_folder
folder = kv_folder.make_run_folder(sys.argv[1])
print(folder.path, flush=True)
if sys.argv[2] == "die":
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)  # as a node killed with kill -9: nothing cleans up
sys.stdin.read()  # alive, holding the folder's lock, until the test closes stdin
"""


def owner_process(parent: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    """Another process that makes a run folder in `parent`, then dies by SIGKILL ("die") or
    keeps it until its stdin closes ("live"); returns (the process, its folder)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(parent), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, Path(proc.stdout.readline().strip())


def test_a_new_run_folder_sweeps_those_of_dead_runs_only(tmp_path: Path) -> None:
    """Issue 21: a node killed with kill -9 leaves its folder behind. The next folder made beside
    it removes it (its lock is held by no process); a live run's folder (its lock held by another
    process), a folder given as `shared_dir` (no lock file) and other folders are kept."""
    live, live_folder = owner_process(tmp_path, "live")
    try:  # the dead run's sweep, when it made its folder, kept the live one
        dead, dead_folder = owner_process(tmp_path, "die")
        assert dead.wait(30) == -signal.SIGKILL
        for folder in (dead_folder, live_folder):
            assert folder.parent == tmp_path and (folder / kv_folder.OWNER_LOCK).is_file()
        assert "pid=" in (dead_folder / kv_folder.OWNER_LOCK).read_text()
        (dead_folder / ("0" * 32)).mkdir()  # an export the dead run left
        given = tmp_path / f"{kv_folder.RUN_FOLDER_PREFIX}given"  # a user's shared_dir
        given.mkdir()
        other = tmp_path / "unrelated"
        other.mkdir()
        with open_kv_folder(EngineConfig(), tmp_path) as mine:
            ours = Path(mine.kv_transfer.shared_dir)
            assert sorted(tmp_path.iterdir()) == sorted([live_folder, ours, given, other])
            # a sweep while this run lives keeps its folder too (the lock is held in-process)
            assert kv_folder.sweep_run_folders(tmp_path) == 0 and ours.is_dir()
        with open_kv_folder(config("example", given), tmp_path) as resolved:
            assert resolved.kv_transfer.shared_dir == str(given)  # given: nothing made or swept
    finally:
        live.stdin.close()
        assert live.wait(30) == 0
    assert live_folder.is_dir()  # it exited without removing it: its lock is free now
    assert kv_folder.sweep_run_folders(tmp_path) == 1
    assert sorted(tmp_path.iterdir()) == sorted([given, other])


def test_a_given_folder_or_another_connector_is_kept_as_it_is(tmp_path: Path) -> None:
    for engine in (config("example", tmp_path / "kv"), config("none"), config("nixl")):
        with open_kv_folder(engine) as resolved:
            assert resolved is engine
        assert cell_kv_config(engine) is engine
    assert not (tmp_path / "kv").exists()  # made by the cells that use it, never removed here
    for connector in ("none", "nixl"):  # a folder no connector would use is refused, not ignored
        with pytest.raises(ValueError, match="shared_dir='/x' is only used by connector='example'"):
            KVTransferConfig(connector=connector, shared_dir="/x")


def test_cells_spawned_outside_a_run_share_their_process_folder() -> None:
    one, two = cell_kv_config(EngineConfig()), cell_kv_config(EngineConfig(max_model_len=64))
    folder = one.kv_transfer.shared_dir
    assert folder and folder == two.kv_transfer.shared_dir and Path(folder).is_dir()
    assert Path(folder).name.startswith(kv_folder.RUN_FOLDER_PREFIX)


def test_a_cell_never_runs_on_an_empty_folder() -> None:
    with pytest.raises(ConfigError, match="engine.kv_transfer.shared_dir is empty"):
        FolderTransport(EngineConfig()).prepare()


def test_the_folder_connector_leaves_the_engine_its_cores(tmp_path: Path, monkeypatch) -> None:
    """vLLM's CPU backend reserves a core more for any connector (`auto` binding); the folder
    connector runs no thread, so `prepare` reserves what vLLM would without one, unless set."""
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    FolderTransport(config("example", tmp_path / "kv")).prepare()
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1" and (tmp_path / "kv").is_dir()
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # the user's choice stands
    FolderTransport(config("example", tmp_path / "kv")).prepare()
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_none_refuses_export_and_release() -> None:
    kv = NoKVTransport(config("none"))
    with pytest.raises(
        EngineUnavailableError, match="export_kv needs engine.kv_transfer.connector"
    ):
        kv.check_export(list(range(40)), max_model_len=256)
    with pytest.raises(EngineUnavailableError, match="release_kv needs"):
        asyncio.run(kv.release("ab" * 16))


@pytest.mark.parametrize(
    "n, error", [(BLOCK, "at least block_size \\+ 1 = 17"), (256, "must be < max_model_len=256")]
)
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
    assert (export.tokens, export.sequence_tokens, export.bytes, export.weight_version) == (
        32,
        37,
        102,
        3,
    )
    assert export.key == kv_folder.export_key(ids, BLOCK, 3)[0] and export.transfer_params is None
    assert host.requests == [(ids, {kv_folder.EXPORT_PARAM: True, kv_folder.VERSION_PARAM: 3})]
    assert (tmp_path / export.key / kv_folder.COMPLETE).read_text() == "3\n"
    assert kv_folder.complete_version(tmp_path, export.key) == 3
    marks = {kv_folder.IMPORT_PARAM: True, kv_folder.VERSION_PARAM: 3}
    assert kv.import_params(export, weight_version=3) == marks

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
    assert not (tmp_path / kv_folder.export_key(ids, BLOCK, 3)[0]).exists()
    assert kv.statistics().exports == 0


def test_folder_export_that_stored_nothing_fails(tmp_path: Path) -> None:
    kv = FolderTransport(config("example", tmp_path))
    host = ScriptedHost(None)  # the request ran but the connector wrote no file
    ids = list(range(40))
    os.makedirs(tmp_path / kv_folder.export_key(ids, BLOCK, 3)[0])
    with pytest.raises(EngineError, match="stored nothing"):
        asyncio.run(kv.export(host, ids))


def test_nixl_export_hands_over_the_pull_handle() -> None:
    handle = {
        "remote_request_id": "r-7",
        "remote_block_ids": [[1, 2]],
        "remote_prefill_cached_tokens": 5,
    }
    kv = NixlTransport(config("nixl"))
    host = ScriptedHost(handle=handle)
    export = asyncio.run(kv.export(host, list(range(40))))
    assert (export.key, export.tokens, export.sequence_tokens, export.bytes) == ("r-7", 39, 40, 0)
    assert export.transfer_params == {"remote_request_id": "r-7", "remote_block_ids": [[1, 2]]}
    assert host.requests[0][1] == {"do_remote_decode": True}
    assert export.weight_version == 3
    assert kv.import_params(export, weight_version=3) == export.transfer_params
    assert asyncio.run(kv.release(export.key)) is False
    assert (kv.statistics().exports, kv.statistics().tokens_exported) == (1, 39)


def test_nixl_export_without_a_handle_fails() -> None:
    kv = NixlTransport(config("nixl"))
    with pytest.raises(EngineError, match="kept no blocks for 40 tokens"):
        asyncio.run(kv.export(ScriptedHost(handle=None), list(range(40))))


# -- weight versions (issue 18) -------------------------------------------------------------


@pytest.mark.parametrize("connector", ["example", "nixl"])
def test_an_export_of_version_3_is_refused_at_version_4_and_imported_at_3(
    connector: str, tmp_path: Path
) -> None:
    handle = {"remote_request_id": "r-1", "remote_block_ids": [[4]]}
    folder = tmp_path if connector == "example" else None
    kv = kv_transport(config(connector, folder))
    host = ScriptedHost(folder, handle=handle)
    export = asyncio.run(kv.export(host, list(range(40))))
    assert export.weight_version == 3

    host.weight_version = 4  # the importing engine loaded new weights: stale KV, prefilled instead
    assert kv.import_params(export, weight_version=host.weight_version) is None
    stats = kv.statistics()
    assert (stats.imports, stats.imports_refused) == (0, 1)

    same = kv.import_params(export, weight_version=3)  # the weights that computed it: loaded
    want = (
        {kv_folder.IMPORT_PARAM: True, kv_folder.VERSION_PARAM: 3}
        if connector == "example"
        else handle
    )
    assert same == want
    stats = kv.statistics()
    assert (stats.imports, stats.imports_refused) == (1, 1)


def test_a_cached_export_is_not_reused_under_other_weights(tmp_path: Path) -> None:
    """The same tokens exported again after a weight load are computed again, under another
    key: the version 3 export is never handed out as one of version 4."""
    kv = FolderTransport(config("example", tmp_path))
    host = ScriptedHost(tmp_path)
    ids = list(range(10, 50))
    old = asyncio.run(kv.export(host, ids))
    host.weight_version = 4
    new = asyncio.run(kv.export(host, ids))
    assert (old.weight_version, new.weight_version) == (3, 4) and old.key != new.key
    assert new.key == kv_folder.export_key(ids, BLOCK, 4)[0]
    assert [params[kv_folder.VERSION_PARAM] for _, params in host.requests] == [3, 4]
    assert kv_folder.complete_version(tmp_path, old.key) == 3
    assert kv_folder.complete_version(tmp_path, new.key) == 4


def test_export_keys_hash_the_tokens_with_the_version_as_example_connector_does() -> None:
    """`export_key` names the folder ExampleConnector writes for the stored tokens with the
    version's salt as the request's `mm_hashes` (int64 token bytes, then the salt)."""
    import hashlib

    import numpy as np

    ids = list(range(7, 47))  # 40 tokens: 32 stored
    key, n = kv_folder.export_key(ids, BLOCK, 5)
    data = np.asarray(ids[:32], dtype=np.int64).tobytes() + b"gyre-weights-v5"
    assert (key, n) == (hashlib.md5(data).hexdigest(), 32)
    assert kv_folder.version_salt(5) == "gyre-weights-v5"
    assert kv_folder.export_key(ids, BLOCK, 6)[0] != key


class _Request:
    """What `GyreKVConnector`'s scheduler side reads of a vLLM request."""

    def __init__(self, rid: str, prompt: list[int], params: dict[str, Any] | None) -> None:
        self.request_id = rid
        self.prompt_token_ids = prompt
        self.kv_transfer_params = params


def test_the_connector_loads_only_marked_requests_of_the_exports_version(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from gyre.engines.kv_connector import GyreKVConnector

    connector = GyreKVConnector.__new__(GyreKVConnector)  # the scheduler side, without vLLM
    connector._block_size, connector._storage_path = BLOCK, str(tmp_path)
    connector._store_versions = {}
    prompt = list(range(40))
    key, _ = kv_folder.export_key(prompt, BLOCK, 3)
    (tmp_path / key).mkdir()
    (tmp_path / key / "layer0.safetensors").write_bytes(b"x")
    kv_folder.mark_complete(tmp_path, key, 3)

    def matched(params: dict[str, Any] | None) -> int | None:
        return connector.get_num_new_matched_tokens(_Request("r", prompt, params), 0)[0]

    def marks(version: int) -> dict[str, Any]:
        return {kv_folder.IMPORT_PARAM: True, kv_folder.VERSION_PARAM: version}

    assert matched(marks(3)) == 32  # the version that computed it
    assert matched(marks(4)) == 0  # stale for a request of version 4: prefilled
    assert matched(None) == 0  # an ordinary request never loads
    store = {kv_folder.EXPORT_PARAM: True, kv_folder.VERSION_PARAM: 4}
    assert matched(store) == 0 and connector._store_versions == {"r": 4}
