"""A cell's process on the node: `spawn_cell`, `wait_cell_ready` and `CellProcess` (stop, reap).

A cell runs in its own process group, so stopping it takes vLLM's engine-core and worker
processes with it, but in the node's session: a new session is a new scheduling autogroup, and
the spinning vLLM processes of a cell in a group of its own starved the node's client (see the
`gyre.runtime.cell` docstring). A cell also gets SIGTERM when the node dies (`PR_SET_PDEATHSIG`).
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
from pathlib import Path

import httpx
import msgspec

from gyre.config import EngineConfig, RLConfig, TrainerConfig
from gyre.engines.kv_transport import cell_kv_config
from gyre.errors import EngineTimeoutError, EngineUnavailableError
from gyre.runtime.cell_wire import Health, cell_secret, decode

__all__ = ["CellProcess", "spawn_cell", "wait_cell_ready", "cell_devices"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {cell_secret()}"}


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
    module: str = "gyre.runtime.cell",
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
            # client (requests reached the engine one by one; see the `gyre.runtime.cell` docstring)
            process_group=0,
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
    with httpx.Client(timeout=5.0, headers=_auth_headers()) as http:
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
