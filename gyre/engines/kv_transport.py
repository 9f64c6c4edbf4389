"""The KV transport seam: how a vLLM engine hands a sequence's KV cache to another engine.

Owns `KVTransport` (what `VLLMEngine` calls for KV migration), `KVHost` (what a transport needs of
its engine), `KVTransportStatistics`, one transport per `kv_transfer.connector`: `NoKVTransport`
(`none`), `FolderTransport` (`example`: vLLM's ExampleConnector on a shared folder) and
`NixlTransport` (`nixl`: vLLM's NixlConnector, the target pulls the KV from the source's memory),
and `kv_transport(config)`, the one place that reads `kv_transfer.connector`. Every export carries
the weight version that computed it; `import_params` refuses (and counts) one of another version
than the importing engine's, which then prefills instead. Where the `example` folder comes from:
`open_kv_folder` (a run's own, removed at its end) and `cell_kv_config` (what a cell is spawned
with: never an empty folder).

Knows nothing about routing or when to migrate (`gyre.routing.continuation` decides that); the
vLLM side of each connector is `gyre.engines.kv_connector` / `gyre.engines.kv_nixl`.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import msgspec

from gyre._counters import Counters
from gyre.config import EngineConfig
from gyre.engines import kv_folder
from gyre.engines.protocol import KVExport
from gyre.errors import (
    ConfigError,
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    InvalidRequestError,
)

__all__ = [
    "KVHost",
    "KVTransport",
    "KVTransportStatistics",
    "NoKVTransport",
    "FolderTransport",
    "NixlTransport",
    "kv_transport",
    "open_kv_folder",
    "cell_kv_config",
]


class KVHost(Protocol):
    """What a transport needs of the engine it exports from (`VLLMEngine`)."""

    weight_version: int
    """The version of the weights the engine serves now."""

    async def wait_ready(self) -> None:
        """Return once no weight load runs on the engine."""
        ...

    async def run_export_request(
        self, token_ids: list[int], kv_transfer_params: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        """Run `token_ids` as a greedy 1-token request carrying `kv_transfer_params`, counted as in
        flight (a weight load waits for it); returns (its request ID, the last `kv_transfer_params`
        vLLM returned, None if none)."""
        ...


class KVTransportStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a transport (docs/style.md rule 6); `EngineStatistics.kv_*` carries them."""

    exports: int
    """Exports made."""
    tokens_exported: int
    """Tokens whose KV those exports hold."""
    released: int
    """Exports deleted by `release`."""
    expired: int
    """Exports deleted because their lease ran out."""
    imports: int = 0
    """Requests handed to vLLM to load an export (`import_params` answered)."""
    imports_refused: int = 0
    """Imports refused because the export was computed with other weights than the importing
    engine serves: the request prefilled instead (recompute)."""

    def engine_fields(self) -> dict[str, int]:
        """These counters as `EngineStatistics` fields: `kv_` + each name."""
        return {f"kv_{name}": getattr(self, name) for name in self.__struct_fields__}


class KVTransport(Protocol):
    """One KV connector as seen by the engine that exports and loads through it.

    Errors of `export` / `release`: `EngineUnavailableError` (no connector, weights changed during
    the export), `InvalidRequestError` (sequence too short or too long, malformed key),
    `EngineTimeoutError` (`request_timeout_s`), `EngineError` (nothing was exported).
    """

    def engine_args(self) -> dict[str, Any]:
        """Keywords for vLLM's `AsyncEngineArgs`: the connector and what it requires."""
        ...

    def prepare(self) -> None:
        """Ready this process and the store before the engine starts (`VLLMEngine.start`)."""
        ...

    def check_export(self, token_ids: list[int], *, max_model_len: int) -> None:
        """Raise unless `token_ids` (prompt + tokens so far) can be exported: at least
        block_size + 1 tokens and fewer than `max_model_len`."""
        ...

    async def export(self, host: KVHost, token_ids: list[int]) -> KVExport:
        """Export the KV of `token_ids` (checked by `check_export`) from `host`, within
        `request_timeout_s`."""
        ...

    def import_params(self, export: KVExport, *, weight_version: int) -> dict[str, Any] | None:
        """vLLM `kv_transfer_params` of a request that loads `export` on an engine serving
        `weight_version`; None when it must prefill instead: the export was computed with another
        version (counted in `imports_refused`, never loaded), or the connector moves no KV."""
        ...

    async def release(self, key: str) -> bool:
        """Delete export `key` once loaded; False if there was nothing to delete."""
        ...

    def statistics(self) -> KVTransportStatistics: ...


class _Transport:
    """Shared by the transports: the config, the counters and the sequence check."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._counts = Counters(
            "exports", "tokens_exported", "released", "expired", "imports", "imports_refused"
        )

    def check_export(self, token_ids: list[int], *, max_model_len: int) -> None:
        block = self.config.block_size
        if kv_folder.stored_tokens(len(token_ids), block) == 0:
            raise InvalidRequestError(
                f"export_kv of {len(token_ids)} tokens: at least block_size + 1 = {block + 1} "
                "needed"
            )
        if len(token_ids) >= max_model_len:
            raise InvalidRequestError(
                f"export_kv of {len(token_ids)} tokens: must be < max_model_len={max_model_len}"
            )

    def _exported(self, tokens: int) -> None:
        self._counts["exports"] += 1
        self._counts["tokens_exported"] += tokens

    def _timed_out(self, token_ids: list[int]) -> EngineTimeoutError:
        return EngineTimeoutError(
            f"export_kv of {len(token_ids)} tokens exceeded "
            f"request_timeout_s={self.config.request_timeout_s}"
        )

    def import_params(self, export: KVExport, *, weight_version: int) -> dict[str, Any] | None:
        if export.weight_version != weight_version:  # stale KV: recomputed, never loaded
            self._counts["imports_refused"] += 1
            return None
        params = self._import_params(export)
        self._counts["imports"] += params is not None
        return params

    def _import_params(self, export: KVExport) -> dict[str, Any] | None:
        """The connector's `kv_transfer_params` for loading `export` (its version checked)."""
        return None

    def statistics(self) -> KVTransportStatistics:
        return KVTransportStatistics(**self._counts)


_RESERVED_CPUS = "VLLM_CPU_NUM_OF_RESERVED_CPU"
"""vLLM's CPU backend: cores left to other processes in its `auto` binding (default: 1 per
worker, one more with a KV connector)."""
_NO_CONNECTOR = "{op} needs engine.kv_transfer.connector = 'example' or 'nixl' (it is 'none')"


class NoKVTransport(_Transport):
    """`connector = "none"`: no KV leaves the engine; every export and release is refused."""

    def engine_args(self) -> dict[str, Any]:
        return {}

    def prepare(self) -> None:
        return None

    def check_export(self, token_ids: list[int], *, max_model_len: int) -> None:
        raise EngineUnavailableError(_NO_CONNECTOR.format(op="export_kv"))

    async def export(self, host: KVHost, token_ids: list[int]) -> KVExport:
        raise EngineUnavailableError(_NO_CONNECTOR.format(op="export_kv"))

    async def release(self, key: str) -> bool:
        raise EngineUnavailableError(_NO_CONNECTOR.format(op="release_kv"))


class FolderTransport(_Transport):
    """`connector = "example"`: exports are files in `kv_transfer.shared_dir`
    (`gyre.engines.kv_folder`).

    `export` runs the sequence as a 1-token request marked for storing with the engine's weight
    version, which is part of the export's key; its prefix is normally still in the engine's prefix
    cache (an abort keeps it), so this costs about one decode step. Exporting a sequence again at
    the same version refreshes its lease; at another version it is another export. A request loads
    an export only when marked for it (`import_params`: same version), and its prompt is exactly
    the exported sequence. `export` and `release` sweep expired exports.
    """

    def engine_args(self) -> dict[str, Any]:
        from vllm.config import KVTransferConfig

        return dict(
            kv_transfer_config=KVTransferConfig(
                kv_connector="GyreKVConnector",
                kv_connector_module_path="gyre.engines.kv_connector",
                kv_role="kv_both",
                kv_connector_extra_config={
                    "shared_storage_path": self.config.kv_transfer.shared_dir
                },
                kv_load_failure_policy="recompute",  # an export released mid-load: prefill instead
            ),
            max_num_batched_tokens=max(
                self.config.max_model_len, 2048
            ),  # a chunked store is corrupt
        )

    def prepare(self) -> None:
        kv = self.config.kv_transfer
        if not kv.shared_dir:  # cells of one run must share one folder: the spawner names it
            raise ConfigError(
                "engine.kv_transfer.shared_dir is empty in the cell: a cell must be spawned with "
                "its run's folder (`open_kv_folder`, `cell_kv_config`) or a path"
            )
        os.makedirs(kv.shared_dir, exist_ok=True)
        kv_folder.sweep(kv.shared_dir, kv.lease_s)  # leftovers of a crashed run
        # vLLM's CPU backend reserves one more core for any connector (NIXL's progress thread);
        # this one runs no thread of its own, so the worker keeps the cores it has without one
        # (on 2 cores: 1 OpenMP thread, not 2; benchmarks/results/connector_idle.json)
        os.environ.setdefault(_RESERVED_CPUS, "1")

    async def export(self, host: KVHost, token_ids: list[int]) -> KVExport:
        kv = self.config.kv_transfer
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                await host.wait_ready()
                version = host.weight_version
                key, tokens = kv_folder.export_key(token_ids, self.config.block_size, version)
                folder = os.path.join(kv.shared_dir, key)
                if kv_folder.complete_version(kv.shared_dir, key) == version:
                    os.utime(folder)
                else:
                    marks = {kv_folder.EXPORT_PARAM: True, kv_folder.VERSION_PARAM: version}
                    await host.run_export_request(token_ids, marks)
                    if host.weight_version != version:
                        await asyncio.to_thread(kv_folder.release, kv.shared_dir, key)
                        raise EngineUnavailableError(
                            f"export_kv: weights changed from version {version} to "
                            f"{host.weight_version} meanwhile"
                        )
                    try:
                        await asyncio.to_thread(
                            kv_folder.mark_complete, kv.shared_dir, key, version
                        )
                    except FileNotFoundError as exc:
                        raise EngineError(f"export_kv stored nothing: {exc}") from None
        except TimeoutError:
            raise self._timed_out(token_ids) from None
        size = await asyncio.to_thread(kv_folder.export_bytes, kv.shared_dir, key)
        self._exported(tokens)
        self._counts["expired"] += await asyncio.to_thread(
            kv_folder.sweep, kv.shared_dir, kv.lease_s
        )
        return KVExport(
            key=key,
            tokens=tokens,
            sequence_tokens=len(token_ids),
            bytes=size,
            weight_version=version,
            seconds=time.monotonic() - t0,
        )

    def _import_params(self, export: KVExport) -> dict[str, Any] | None:
        return {kv_folder.IMPORT_PARAM: True, kv_folder.VERSION_PARAM: export.weight_version}

    async def release(self, key: str) -> bool:
        kv = self.config.kv_transfer
        try:
            released = await asyncio.to_thread(kv_folder.release, kv.shared_dir, key)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        self._counts["released"] += released
        self._counts["expired"] += await asyncio.to_thread(
            kv_folder.sweep, kv.shared_dir, kv.lease_s
        )
        return released


class NixlTransport(_Transport):
    """`connector = "nixl"`: the source keeps an export's blocks for `lease_s`; the target pulls
    them.

    `export` runs the sequence as a 1-token request that keeps its blocks for a remote decode; the
    handle vLLM returns (`KVExport.transfer_params`) tells the target where to pull from. `release`
    has nothing to do (the source frees the blocks once pulled, or after the lease). Needs the
    `nixl` package; each engine's side channel gets a free port in `prepare`.
    """

    def engine_args(self) -> dict[str, Any]:
        from vllm.config import KVTransferConfig
        from vllm.platforms import current_platform

        return dict(
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlConnector",
                kv_connector_module_path="gyre.engines.kv_nixl",  # vLLM's, progress thread off
                kv_role="kv_both",
                kv_buffer_device="cpu" if current_platform.is_cpu() else "cuda",
                kv_connector_extra_config={
                    "kv_lease_duration": max(1, int(self.config.kv_transfer.lease_s))
                },
            ),
        )

    def prepare(self) -> None:
        os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(_free_port())  # one per engine

    async def export(self, host: KVHost, token_ids: list[int]) -> KVExport:
        t0 = time.monotonic()
        handle = None
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                await host.wait_ready()
                version = host.weight_version
                rid, handle = await host.run_export_request(token_ids, {"do_remote_decode": True})
        except TimeoutError:
            raise self._timed_out(token_ids) from None
        if not handle or host.weight_version != version:
            raise EngineError(
                f"export_kv: NixlConnector kept no blocks for {len(token_ids)} tokens "
                f"(handle {handle!r})"
            )
        handle = dict(handle)
        handle.pop(
            "remote_prefill_cached_tokens", None
        )  # else the target reports this engine's cache hits as its own
        tokens = len(token_ids) - 1  # the target computes the last token itself
        self._exported(tokens)
        return KVExport(
            key=str(handle.get("remote_request_id", rid)),
            tokens=tokens,
            sequence_tokens=len(token_ids),
            bytes=0,
            weight_version=version,
            seconds=time.monotonic() - t0,
            transfer_params=handle,
        )

    def _import_params(self, export: KVExport) -> dict[str, Any] | None:
        return dict(export.transfer_params) if export.transfer_params else None

    async def release(self, key: str) -> bool:
        return False


def kv_transport(config: EngineConfig) -> KVTransport:
    """The transport for `config.kv_transfer.connector` (`none`, `example` or `nixl`)."""
    kinds: dict[str, Callable[[EngineConfig], KVTransport]] = {
        "none": NoKVTransport,
        "example": FolderTransport,
        "nixl": NixlTransport,
    }
    return kinds[config.kv_transfer.connector](config)


def _needs_folder(config: EngineConfig) -> bool:
    return config.kv_transfer.connector == "example" and not config.kv_transfer.shared_dir


def _with_folder(config: EngineConfig, folder: Path) -> EngineConfig:
    kv = msgspec.structs.replace(config.kv_transfer, shared_dir=str(folder))
    return msgspec.structs.replace(config, kv_transfer=kv)


@contextmanager
def open_kv_folder(
    config: EngineConfig, parent: str | Path | None = None
) -> Iterator[EngineConfig]:
    """`config` with its run's KV folder, for as long as the block runs: with connector `example`
    and no `shared_dir`, a new folder of its own under `parent` (default /dev/shm:
    `kv_folder.run_folder`) that the block's cells share, locked by this process and removed with
    its exports when the block ends, on an error too; making it first removes the folders in
    `parent` of runs that died without removing theirs (`kv_folder.sweep_run_folders`: their lock
    is held by no process; a live run's and a folder given as `shared_dir` are kept). Any other
    config (a path given, `none`, `nixl`) as it is."""
    if not _needs_folder(config):
        yield config
        return
    with kv_folder.run_folder(parent) as folder:
        yield _with_folder(config, folder)


_process_folder: kv_folder.RunFolder | None = None


def cell_kv_config(config: EngineConfig) -> EngineConfig:
    """The engine config a cell is spawned with (`gyre.cell.spawn.spawn_cell`): as
    given, except an `example` folder left empty (a cell spawned outside `open_kv_folder`: by a
    test, a benchmark or by hand), which becomes this process's own folder, one for every cell it
    spawns (so they can migrate between each other), made on first use and removed when the
    process exits (locked by it meanwhile, so a later sweep removes it if the process is
    killed)."""
    global _process_folder
    if not _needs_folder(config):
        return config
    if _process_folder is None:
        _process_folder = kv_folder.make_run_folder()
        atexit.register(_process_folder.remove)
    return _with_folder(config, _process_folder.path)


def _free_port() -> int:
    """A TCP port free on this host now (for NIXL's side channel)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
