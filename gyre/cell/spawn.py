"""A cell's process on the node: `spawn_cell`, `wait_cell_ready` and `CellProcess` (stop, reap).

A cell runs in its own process group, so stopping it takes vLLM's engine-core and worker
processes with it, but in the node's session: a new session is a new scheduling autogroup, and
the spinning vLLM processes of a cell in a group of its own starved the node's client (see the
`gyre.cell.server` docstring). A cell also gets SIGTERM when the node dies (`PR_SET_PDEATHSIG`).
`cell_devices` gives each cell of k devices its own (`CUDA_VISIBLE_DEVICES`); its worker ranks
are in its process group. Knows nothing about the cell's HTTP API beyond `/health`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec

from gyre.cell.client import CellClient
from gyre.cell.wire import Health, auth_headers, cell_secret, decode
from gyre.config import EngineConfig, RLConfig, TrainerConfig
from gyre.engines.kv_transport import cell_kv_config
from gyre.errors import EngineError, EngineTimeoutError, EngineUnavailableError, grouped_errors

__all__ = [
    "CellProcess",
    "spawn_cell",
    "wait_cell_ready",
    "cell_devices",
    "open_cell",
    "open_cells",
]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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
        """Delete the port file and its private folder (`spawn_cell` made it; nothing else is in
        it)."""
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
    devices_per_cell: int = 1,
    module: str = "gyre.cell.server",
) -> CellProcess:
    """Start a cell worker process (returns at once; see `wait_cell_ready`). With `trainer_config`
    the cell also holds a trainer on `model_dir`, over `devices_per_cell` ranks (processes); with
    `rank` (this cell's index), `world_size` (cells) and `group_store` ("HOST:PORT" of
    `host_group_store`) it joins the run-wide gradient group. `env` adds to the environment it
    inherits (`cell_devices`: its devices). A KV folder left empty in `config` (a run's is made by
    `gyre.engines.kv_transport.open_kv_folder`) is this process's own (`cell_kv_config`).
    `module` is the program run as `python -m MODULE` with the cell's arguments (a benchmark's
    cell with routes of its own: `benchmarks.engine_host`); it must be importable from the
    current folder or the installed packages."""
    config = cell_kv_config(config)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port_file = Path(tempfile.mkdtemp(prefix=_PORT_DIR_PREFIX)) / "port"
    cmd = [
        sys.executable,
        "-m",
        module,
        "--model",
        str(model_dir),
        "--engine-config",
        msgspec.json.encode(config).decode(),
        "--host",
        host,
        "--port",
        str(port),
        "--port-file",
        str(port_file),
    ]
    if trainer_config is not None:
        cmd += ["--trainer-config", msgspec.json.encode(trainer_config).decode()]
    if rl_config is not None:
        cmd += ["--rl-config", msgspec.json.encode(rl_config).decode()]
    if group_store is not None:
        cmd += ["--rank", str(rank), "--world-size", str(world_size), "--group-store", group_store]
    if devices_per_cell != 1:
        cmd += ["--devices-per-cell", str(devices_per_cell)]
    cell_secret()  # in our environment before the cell inherits it
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
            env=None if env is None else {**os.environ, **env},
            # its own process group (`stop` can reap vLLM's children too) but the node's session:
            # a new session is a new autogroup, whose spinning vLLM processes starved the node's
            # client (requests reached the engine one by one; see the `gyre.cell.server` docstring)
            process_group=0,
        )
    return CellProcess(process=process, port_file=port_file, log_path=log_path)


def _cpu_binding(rank: int, n: int) -> dict[str, str] | None:
    """Spread several cells' vLLM CPU workers over the cores, one core each, round robin: left to
    itself every engine binds its worker to core 0 (docs/notes/vllm-cpu.md, "Several engines on 2
    cores"). None for one cell, on a GPU, or when the user set `VLLM_CPU_OMP_THREADS_BIND`."""
    import torch

    if n < 2 or torch.cuda.is_available() or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return None
    cores = sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[rank % len(cores)])}


def cell_devices(index: int, devices_per_cell: int) -> dict[str, str] | None:
    """The environment that gives this host's `index`-th cell its own `devices_per_cell` GPUs:
    `CUDA_VISIBLE_DEVICES` of devices index*k .. index*k + k - 1 (of the node's own
    `CUDA_VISIBLE_DEVICES` when set), so its ranks take `cuda:0` .. `cuda:k-1`. None without a
    GPU. Raises `ValueError` when the host has too few devices."""
    import torch

    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = (
        [d.strip() for d in visible.split(",") if d.strip()]
        if visible
        else [str(d) for d in range(torch.cuda.device_count())]
    )
    first = index * devices_per_cell
    if first + devices_per_cell > len(devices):
        raise ValueError(
            f"cell {index} needs devices {first}..{first + devices_per_cell - 1}: this host has "
            f"{len(devices)} ({devices_per_cell} per cell)"
        )
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices[first : first + devices_per_cell])}


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
    with httpx.Client(timeout=5.0, headers=auth_headers()) as http:
        while time.monotonic() < deadline:
            if cell.process.poll() is not None:
                raise EngineUnavailableError(
                    f"cell exited with code {cell.process.returncode} during start-up; "
                    f"log tail:\n{_tail(cell.log_path)}"
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
    raise EngineTimeoutError(
        f"cell not ready within startup_timeout_s={timeout_s}; log tail:\n{_tail(cell.log_path)}"
    )


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
    devices_per_cell: int = 1,
) -> AsyncIterator[CellClient]:
    """Spawn a cell (its trainer over `devices_per_cell` ranks; on GPU it sees the first
    `devices_per_cell` devices), wait until it serves, yield its client; stop the process on
    exit."""
    cell = spawn_cell(
        model_dir,
        config,
        log_path=log_path,
        host=host,
        trainer_config=trainer_config,
        rl_config=rl_config,
        rank=rank,
        world_size=world_size,
        group_store=group_store,
        env=cell_devices(0, devices_per_cell),
        devices_per_cell=devices_per_cell,
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
    first_rank: int = 0,
    world_size: int | None = None,
    group_store: str | None = None,
    store_host: str | None = None,
    store_port: int = 0,
    remote: Callable[[str], Awaitable[Sequence[tuple[int, str, Any]]]] | None = None,
    devices_per_cell: int = 1,
) -> AsyncIterator[list[CellClient]]:
    """Start `n` cells at once on this host; yield their clients in rank order (logs at
    `log_dir/cell-<rank>.log`). Without `trainer_config` the cells have no trainer and no group.
    Every process is stopped on exit; a cell that fails to start stops the others and raises as
    `wait_cell_ready` does.

    The gradient group has `world_size` ranks (default `n`); these cells are ranks `first_rank`
    .. `first_rank + n - 1`. Its TCPStore is hosted here at `store_host` (default `host`; port
    `store_port`, 0: a free one) unless `group_store` ("HOST:PORT") names one elsewhere (a worker
    host's cells: `gyre.cell.join`). `remote` (the head of several hosts) is awaited with the
    store's address, while the local cells start, for the other hosts' ready cells as (rank, base
    URL, process-like with `poll()`); their clients are yielded with the local ones, all in rank
    order, so `clients[i].rank == i` over the whole group.

    `devices_per_cell` (k, `cells.devices_per_cell`): each cell's trainer is k ranks (ZeRO-3,
    `gyre.cell.ranks`), and on GPU the i-th local cell sees only devices i*k .. i*k+k-1
    (`cell_devices`); `rank` stays the cell's index, its ranks in the gradient group are
    rank*k .. rank*k + k - 1. Raises `ValueError` for k < 1, k > 1 with a trainer below ZeRO-3,
    or too few devices."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if devices_per_cell < 1:
        raise ValueError(f"devices_per_cell={devices_per_cell} must be >= 1")
    if devices_per_cell > 1 and trainer_config is not None and trainer_config.zero_stage != 3:
        raise ValueError(
            f"devices_per_cell={devices_per_cell} needs trainer.zero_stage=3, "
            f"got {trainer_config.zero_stage}"
        )
    devices = [cell_devices(i, devices_per_cell) for i in range(n)]
    world_size = n if world_size is None else world_size
    if first_rank < 0 or first_rank + n > world_size:
        raise ValueError(f"ranks {first_rank}..{first_rank + n - 1} must be in [0, {world_size})")
    store = None
    address = group_store
    if trainer_config is not None and group_store is None:
        from gyre.cell.grad_group import host_group_store

        store_host = store_host or host
        store = host_group_store(
            store_host,
            timeout_s=max(config.startup_timeout_s, trainer_config.train_timeout_s),
            port=store_port,
        )
        address = f"{store_host}:{store.port}"
    if trainer_config is None:
        address = None
    processes = [
        spawn_cell(
            model_dir,
            config,
            log_path=Path(log_dir) / f"cell-{rank}.log",
            host=host,
            trainer_config=trainer_config,
            rl_config=rl_config,
            rank=None if address is None else rank,
            world_size=None if address is None else world_size,
            group_store=address,
            env={**(_cpu_binding(rank, world_size) or {}), **(devices[rank - first_rank] or {})},
            devices_per_cell=devices_per_cell,
        )
        for rank in range(first_rank, first_rank + n)
    ]
    remote_cells: list[tuple[int, str, Any]] = []
    try:
        urls: list[str | None] = [None] * n

        async def wait(rank: int) -> None:
            # abandoned on cancel: the first cell that fails must not wait out the others' start-up
            # timeouts (ranks blocked on a missing peer never become ready); `finally` stops them
            urls[rank] = await anyio.to_thread.run_sync(
                wait_cell_ready,
                processes[rank],
                config.startup_timeout_s,
                host,
                abandon_on_cancel=True,
            )

        async def wait_remote() -> None:
            assert remote is not None
            remote_cells.extend(await remote(address or ""))

        try:
            async with anyio.create_task_group() as tg:
                for rank in range(n):
                    tg.start_soon(wait, rank)
                if remote is not None:
                    tg.start_soon(wait_remote)
        except BaseExceptionGroup as group:
            if errors := grouped_errors(group, EngineError):
                raise errors[0] from None  # the first failure, as `wait_cell_ready` raises it
            raise
        ready = [url for url in urls if url is not None]  # each wait set its url or raised
        async with AsyncExitStack() as stack:
            cells = [
                (first_rank + i, url, process.process)  # the node watches it for death
                for i, (url, process) in enumerate(zip(ready, processes, strict=True))
            ]
            clients = []
            for rank, url, process in sorted([*cells, *remote_cells], key=lambda c: c[0]):
                client = await stack.enter_async_context(CellClient(url, config, trainer_config))
                client.rank = rank
                client.process = process
                clients.append(client)
            yield clients
    finally:
        with anyio.CancelScope(shield=True):
            for process in processes:
                await anyio.to_thread.run_sync(process.stop)
        del store  # the store outlives every cell that used it
