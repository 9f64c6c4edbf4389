"""The node's view of a cell: `CellClient` (the `InferenceEngine` protocol over HTTP) and start-up.

Owns `CellClient`, `CellProcess`, `spawn_cell`, `wait_cell_ready`, `open_cell` and `open_cells`
(n cells around a node-hosted gradient-group store). The client runs on anyio + httpx, so it works
on the node's trio loop and on asyncio; code above it cannot tell a cell from the scripted engine.
Besides the `InferenceEngine` protocol it drives the cell's role and trainer (`switch_role`,
`train`, `send_gradients`, `receive_gradients`, `step`, ...). Every wait is bounded (DESIGN.md
invariant 7): requests by `request_timeout_s`, weight loads by `weight_load_timeout_s`, training
calls and switches by `TrainerConfig.train_timeout_s`, start-up by `startup_timeout_s`.
Knows nothing about what the cell runs inside (vLLM, DeepSpeed).
"""

from __future__ import annotations

import ctypes
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import httpx
import msgspec

from gyre.config import EngineConfig, RLConfig, TrainerConfig
from gyre.engines.protocol import (
    AccumulateStatistics,
    Completion,
    EngineStatistics,
    GenerateRequest,
    KVExport,
    TokenDelta,
)
from gyre.errors import (
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    GyreError,
    WeightSyncError,
    error_from_code,
)
from gyre.runtime.cell_wire import (
    AbortRequest,
    CellStatistics,
    CheckpointRequest,
    ExportKVRequest,
    FrameReader,
    Health,
    LoadWeightsRequest,
    ReceiveGradientsRequest,
    ReleaseKVRequest,
    SendGradientsRequest,
    StepRequest,
    StepResult,
    SwitchRequest,
    SwitchResult,
    TrainRequest,
    WireError,
    cell_secret,
    decode,
    encode,
)
from gyre.trajectory.pack import PackedBatch

__all__ = ["CellClient", "CellProcess", "spawn_cell", "wait_cell_ready", "open_cell", "open_cells", "StepResult"]

_HEADERS = {"Content-Type": "application/msgpack"}
_TRAIN_TIMEOUT_MARGIN_S = 10.0
"""Seconds the client waits for a training call beyond the cell's own `train_timeout_s`."""


def _auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {cell_secret()}"}

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _raise_for(response: httpx.Response, body: bytes) -> None:
    if response.status_code == 200:
        return
    try:
        err = decode(body, WireError)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise EngineError(f"cell answered HTTP {response.status_code}: {body[:200]!r}") from None
    raise error_from_code(err.code, err.message)


class CellClient:
    """`InferenceEngine` over a cell's token-level API (see `gyre.runtime.cell`).

    Use as `async with CellClient(url, config) as engine:`. `statistics()` returns the snapshot
    fetched by the last `refresh_statistics()` (HTTP cannot be called synchronously).
    """

    def __init__(
        self, base_url: str, config: EngineConfig = EngineConfig(), trainer_config: TrainerConfig | None = None
    ) -> None:
        self.base_url = base_url
        self.config = config
        self.trainer_config = trainer_config or TrainerConfig()
        self.rank: int | None = None
        """The cell's rank in the run-wide gradient group (set by `open_cells`)."""
        self.process: subprocess.Popen | None = None
        """The cell's process when this node started it (set by `open_cells`); None otherwise."""
        self._http: httpx.AsyncClient | None = None
        self._stats: EngineStatistics | None = None

    async def __aenter__(self) -> CellClient:
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=_auth_headers(),
            timeout=httpx.Timeout(self.config.request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        await self.refresh_statistics()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            raise EngineUnavailableError("CellClient used outside `async with`")
        return self._http

    async def _post(self, path: str, body: object, timeout_s: float) -> bytes:
        try:
            with anyio.fail_after(timeout_s):
                response = await self.http.post(path, content=encode(body), headers=_HEADERS, timeout=timeout_s)
        except TimeoutError:
            raise EngineTimeoutError(f"cell {self.base_url} {path}: no answer within {timeout_s} s") from None
        except httpx.TransportError as exc:
            raise EngineUnavailableError(f"cell {self.base_url} {path}: {exc!r}") from None
        _raise_for(response, response.content)
        return response.content

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenDelta]:
        # No cancel scope spans a `yield` (a consumer may resume this generator from another
        # task): each read is bounded by httpx's read timeout, the whole request by a deadline
        # checked between reads.
        pending = set(range(request.sampling.n))
        deadline = time.monotonic() + self.config.request_timeout_s
        try:
            async with self.http.stream("POST", "/generate", content=encode(request), headers=_HEADERS) as response:
                if response.status_code != 200:
                    _raise_for(response, await response.aread())
                reader = FrameReader()
                async for chunk in response.aiter_bytes():
                    for frame in reader.feed(chunk):
                        if frame.error is not None:
                            raise error_from_code(frame.error.code, frame.error.message)
                        delta = frame.delta
                        if delta.finish_reason is not None:
                            pending.discard(delta.index)
                        yield delta
                    if time.monotonic() > deadline and pending:
                        raise httpx.ReadTimeout("request deadline passed")
        except httpx.TimeoutException:
            await self._abort_quietly(request.request_id)
            raise EngineTimeoutError(
                f"request {request.request_id!r} exceeded request_timeout_s={self.config.request_timeout_s}"
            ) from None
        except httpx.TransportError as exc:
            raise EngineUnavailableError(f"cell {self.base_url} lost request {request.request_id!r}: {exc!r}") from None
        if pending:
            raise EngineUnavailableError(
                f"cell {self.base_url} ended request {request.request_id!r} without finishing choices {sorted(pending)}"
            )

    async def _abort_quietly(self, request_id: str) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await self.abort(request_id)
            except GyreError:
                pass  # the cell is unreachable: nothing left to abort there

    async def abort(self, request_id: str) -> list[Completion]:
        body = await self._post("/abort", AbortRequest(request_id), self.config.request_timeout_s)
        return decode(body, list[Completion])

    async def load_weights(self, snapshot: str, version: int) -> None:
        try:
            await self._post("/load_weights", LoadWeightsRequest(snapshot, version), self.config.weight_load_timeout_s)
        except EngineTimeoutError as exc:
            raise WeightSyncError(f"weight load of version {version}: {exc}") from None
        await self.refresh_statistics()

    async def export_kv(self, token_ids: list[int]) -> KVExport:
        """Have the cell store the KV of `token_ids` (see `KVTransferEngine`); bounded by
        `request_timeout_s`. Raises `EngineUnavailableError` (no connector, unreachable),
        `InvalidRequestError`, `EngineTimeoutError`."""
        body = await self._post("/export_kv", ExportKVRequest(list(token_ids)), self.config.request_timeout_s)
        return decode(body, KVExport)

    async def release_kv(self, key: str) -> bool:
        """Delete export `key` in the cell's shared store; False if already gone."""
        body = await self._post("/release_kv", ReleaseKVRequest(key), self.config.request_timeout_s)
        return decode(body, bool)

    async def pause(self) -> None:
        await self._post("/pause", {}, self.config.request_timeout_s)

    async def resume(self) -> None:
        await self._post("/resume", {}, self.config.request_timeout_s)

    async def _get(self, path: str, type_: type, timeout_s: float = 30.0):
        try:
            with anyio.fail_after(timeout_s):
                response = await self.http.get(path)
        except TimeoutError:
            raise EngineTimeoutError(f"cell {self.base_url} {path}: no answer within {timeout_s} s") from None
        except httpx.TransportError as exc:
            raise EngineUnavailableError(f"cell {self.base_url} {path}: {exc!r}") from None
        _raise_for(response, response.content)
        return decode(response.content, type_)

    async def refresh_statistics(self) -> EngineStatistics:
        """Fetch the cell's statistics now (and keep them for `statistics()`)."""
        self._stats = await self._get("/statistics", EngineStatistics)
        return self._stats

    def statistics(self) -> EngineStatistics:
        if self._stats is None:
            raise EngineUnavailableError("no statistics fetched yet: call refresh_statistics()")
        return self._stats

    # -- role and training (bounded by TrainerConfig.train_timeout_s) ---------------------------

    @property
    def _train_timeout_s(self) -> float:
        # the cell bounds its own training calls by train_timeout_s and answers with a clear
        # error; the client waits a little longer so that answer, not its own timeout, arrives
        return self.trainer_config.train_timeout_s + _TRAIN_TIMEOUT_MARGIN_S

    async def switch_role(self, role: str, snapshot: str | None = None, version: int = 0) -> float:
        """Switch the cell to `role` ("rollout" or "train"); returns the seconds the switch took in
        the cell (0 when already there). To "train": in-flight requests are aborted (drain them
        first), the engine paused, `snapshot` (if given) loaded into the trainer as `version`. To
        "rollout": refused (`InvalidRequestError`) while the trainer holds unsent gradients;
        `snapshot` loaded into the engine when `version` differs from its own. Raises
        `InvalidRequestError` for an unknown role or a cell without a trainer."""
        body = await self._post("/switch", SwitchRequest(role=role, snapshot=snapshot, version=version), self._train_timeout_s)
        return decode(body, SwitchResult).seconds

    async def train(
        self, micro_batches: Sequence[PackedBatch], advantages: Mapping[str, float | None]
    ) -> AccumulateStatistics:
        """Accumulate the gradients of `micro_batches` in the cell's trainer (role "train"; no step).
        Raises `InvalidRequestError` in another role, for no micro-batches or an execution
        without an advantage (nothing is accumulated then)."""
        request = TrainRequest(micro_batches=list(micro_batches), advantages=dict(advantages))
        return decode(await self._post("/train", request, self._train_timeout_s), AccumulateStatistics)

    async def load_trainer_weights(self, snapshot: str, version: int) -> None:
        """Load a weight snapshot into the cell's trainer (a satellite syncing to the core).
        Raises `InvalidRequestError` for a bad snapshot or while gradients are held."""
        await self._post("/load_trainer_weights", LoadWeightsRequest(snapshot, version), self._train_timeout_s)

    async def send_gradients(self, dst: int) -> None:
        """Satellite: send the accumulated flat gradient to rank `dst` (the core, which must call
        `receive_gradients` concurrently), then zero it. A failed send keeps the gradients."""
        await self._post("/send_gradients", SendGradientsRequest(dst=dst), self._train_timeout_s)

    async def receive_gradients(self, src: int) -> None:
        """Core: receive rank `src`'s flat gradient and add it to the accumulation."""
        await self._post("/receive_gradients", ReceiveGradientsRequest(src=src), self._train_timeout_s)

    async def step(self, snapshot_root: str) -> StepResult:
        """Core: one optimizer step on everything accumulated and received; when applied, the new
        weights are saved under `snapshot_root/v<version>` (`StepResult.snapshot`)."""
        return decode(await self._post("/step", StepRequest(snapshot_root=str(snapshot_root)), self._train_timeout_s), StepResult)

    async def save_checkpoint(self, path: str) -> None:
        """Core: write a DeepSpeed checkpoint (weights, optimizer state, version) at `path`."""
        await self._post("/save_checkpoint", CheckpointRequest(path=str(path)), self._train_timeout_s)

    async def load_checkpoint(self, path: str) -> None:
        """Core: restore a DeepSpeed checkpoint; `InvalidRequestError` when there is none."""
        await self._post("/load_checkpoint", CheckpointRequest(path=str(path)), self._train_timeout_s)

    async def cell_statistics(self) -> CellStatistics:
        """The cell's role, trainer version and gradient traffic, fetched now."""
        return await self._get("/cell_statistics", CellStatistics)


_PORT_DIR_PREFIX = "gyre-cell-"
"""Prefix of the temporary folder `spawn_cell` makes for a cell's port file."""


class CellProcess(msgspec.Struct, kw_only=True):
    """A spawned cell worker: its process, where it writes its port, and its log file."""

    process: subprocess.Popen
    port_file: Path
    log_path: Path
    base_url: str | None = None

    def stop(self, timeout_s: float = 30.0) -> int:
        """Ask the cell to exit (SIGTERM), then kill it after `timeout_s`; then kill whatever its
        process group left behind (vLLM's engine-core and worker processes when the cell itself
        was killed). Returns the cell's exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is already empty
        self.remove_port_file()
        return self.process.returncode

    def remove_port_file(self) -> None:
        """Delete the port file and its private folder (`spawn_cell` made it; nothing else is in it)."""
        self.port_file.unlink(missing_ok=True)
        if self.port_file.parent.name.startswith(_PORT_DIR_PREFIX):
            shutil.rmtree(self.port_file.parent, ignore_errors=True)


def spawn_cell(
    model_dir: str | Path,
    config: EngineConfig,
    *,
    log_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    trainer_config: TrainerConfig | None = None,
    rl_config: RLConfig | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    group_store: str | None = None,
    env: dict[str, str] | None = None,
) -> CellProcess:
    """Start a cell worker process (returns at once; see `wait_cell_ready`). With `trainer_config`
    the cell also holds a trainer on `model_dir`; with `rank`, `world_size` and `group_store`
    ("HOST:PORT" of `host_group_store`) it joins the run-wide gradient group. `env` adds to the
    environment it inherits."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port_file = Path(tempfile.mkdtemp(prefix=_PORT_DIR_PREFIX)) / "port"
    cmd = [
        sys.executable, "-m", "gyre.runtime.cell",
        "--model", str(model_dir),
        "--engine-config", msgspec.json.encode(config).decode(),
        "--host", host, "--port", str(port), "--port-file", str(port_file),
    ]
    if trainer_config is not None:
        cmd += ["--trainer-config", msgspec.json.encode(trainer_config).decode()]
    if rl_config is not None:
        cmd += ["--rl-config", msgspec.json.encode(rl_config).decode()]
    if group_store is not None:
        cmd += ["--rank", str(rank), "--world-size", str(world_size), "--group-store", group_store]
    cell_secret()  # in our environment before the cell inherits it
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,  # its own process group: `stop` can reap vLLM's children too
        )
    return CellProcess(process=process, port_file=port_file, log_path=log_path)


def _cpu_binding(rank: int, n: int) -> dict[str, str] | None:
    """Spread several cells' vLLM CPU workers over the cores, one core each, round robin: left to
    itself every engine binds its worker to core 0 (shared/notes/vllm-kv-and-cells.md §2). None
    for one cell, on a GPU, or when the user set `VLLM_CPU_OMP_THREADS_BIND`."""
    import torch

    if n < 2 or torch.cuda.is_available() or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return None
    cores = sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[rank % len(cores)])}


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the node dies (Linux `PR_SET_PDEATHSIG`), so a killed node
    leaves no cell (and, through the cell's shutdown, no engine process) behind."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_cell_ready(cell: CellProcess, timeout_s: float, host: str = "127.0.0.1") -> str:
    """Block until the cell's engine serves; return its base URL.

    Raises `EngineUnavailableError` if the process exits or its engine fails to start (with the
    tail of its log), `EngineTimeoutError` after `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0, headers=_auth_headers()) as http:
        while time.monotonic() < deadline:
            if cell.process.poll() is not None:
                raise EngineUnavailableError(
                    f"cell exited with code {cell.process.returncode} during start-up; log tail:\n{_tail(cell.log_path)}"
                )
            if cell.base_url is None and cell.port_file.exists():
                cell.base_url = f"http://{host}:{int(cell.port_file.read_text())}"
                cell.remove_port_file()
            if cell.base_url is not None:
                try:
                    response = http.get(f"{cell.base_url}/health")
                    health = decode(response.content, Health)
                    if health.state == "ready":
                        return cell.base_url
                    if health.state == "failed":
                        cell.stop()
                        raise EngineUnavailableError(f"cell engine failed to start: {health.error}")
                except httpx.TransportError:
                    pass  # not listening yet
            time.sleep(0.2)
    cell.stop()
    raise EngineTimeoutError(f"cell not ready within startup_timeout_s={timeout_s}; log tail:\n{_tail(cell.log_path)}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@asynccontextmanager
async def open_cell(
    model_dir: str | Path,
    config: EngineConfig,
    *,
    log_path: str | Path,
    host: str = "127.0.0.1",
    trainer_config: TrainerConfig | None = None,
    rl_config: RLConfig | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    group_store: str | None = None,
) -> AsyncIterator[CellClient]:
    """Spawn a cell, wait until it serves, yield its client; stop the process on exit."""
    cell = spawn_cell(
        model_dir, config, log_path=log_path, host=host, trainer_config=trainer_config, rl_config=rl_config,
        rank=rank, world_size=world_size, group_store=group_store,
    )
    try:
        url = await anyio.to_thread.run_sync(wait_cell_ready, cell, config.startup_timeout_s, host)
        async with CellClient(url, config, trainer_config) as client:
            client.rank = rank
            yield client
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(cell.stop)


@asynccontextmanager
async def open_cells(
    n: int,
    model_dir: str | Path,
    config: EngineConfig,
    *,
    log_dir: str | Path,
    trainer_config: TrainerConfig | None = None,
    rl_config: RLConfig | None = None,
    host: str = "127.0.0.1",
) -> AsyncIterator[list[CellClient]]:
    """Start `n` cells at once around a gradient-group store hosted here; yield their clients in
    rank order (`client.rank` = 0..n-1; logs at `log_dir/cell-<rank>.log`). Without
    `trainer_config` the cells have no trainer and no group. Every process is stopped on exit; a
    cell that fails to start stops the others and raises as `wait_cell_ready` does."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    store = None
    if trainer_config is not None:
        from gyre.runtime.grad_group import host_group_store

        store = host_group_store(host, timeout_s=max(config.startup_timeout_s, trainer_config.train_timeout_s))
    address = None if store is None else f"{host}:{store.port}"
    processes = [
        spawn_cell(
            model_dir, config, log_path=Path(log_dir) / f"cell-{rank}.log", host=host,
            trainer_config=trainer_config, rl_config=rl_config,
            rank=None if store is None else rank, world_size=None if store is None else n, group_store=address,
            env=_cpu_binding(rank, n),
        )
        for rank in range(n)
    ]
    try:
        urls: list[str | None] = [None] * n

        async def wait(rank: int) -> None:
            # abandoned on cancel: the first cell that fails must not wait out the others' start-up
            # timeouts (ranks blocked on a missing peer never become ready); `finally` stops them
            urls[rank] = await anyio.to_thread.run_sync(
                wait_cell_ready, processes[rank], config.startup_timeout_s, host, abandon_on_cancel=True
            )

        try:
            async with anyio.create_task_group() as tg:
                for rank in range(n):
                    tg.start_soon(wait, rank)
        except BaseExceptionGroup as group:
            if all(isinstance(e, EngineError) for e in group.exceptions):
                raise group.exceptions[0] from None  # the first failure, as `wait_cell_ready` raises it
            raise
        async with AsyncExitStack() as stack:
            clients = []
            for rank, url in enumerate(urls):
                client = await stack.enter_async_context(CellClient(url, config, trainer_config))
                client.rank = rank
                client.process = processes[rank].process  # the node watches it for death
                clients.append(client)
            yield clients
    finally:
        with anyio.CancelScope(shield=True):
            for process in processes:
                await anyio.to_thread.run_sync(process.stop)
        del store  # the store outlives every cell that used it
