"""Engine overhead: tokens/s through gyre's engine protocol (cell process + client) vs vLLM direct.

Each round starts one cell process (`benchmarks.engine_host`: `python -m gyre.cell.server` plus a
route that drives the same engine directly) and times, batch by batch in turn, vLLM's AsyncLLM
called in that process (`generate` with token prompts, DELTA outputs, flat sampled-token logprobs:
what gyre asks of it) and gyre's `CellClient` in this process -> the cell (one multiplexed delta
stream) -> `VLLMEngine` -> the same AsyncLLM. Both paths thus run on one engine start: until
2026-12-06 each path had an engine of its own, and how fast a start happened to run moved a
ratio by up to 30% (committed runs gave 0.90-1.23 at one request for the same code). Then, at
concurrency 32, an OpenAI `/v1/completions` client (this process) through gyre's `TitoProxy`
(`benchmarks.proxy_host`: a process of its own on trio, as the node serves it; in this process
until 2026-12-06, sharing one thread with the load client) + that cell, against vLLM's own OpenAI
server (`vllm.entrypoints.openai.api_server`, its own engine start) on the same model, batch by
batch in turn, the server not being timed stopped (SIGSTOP; until 2026-12-07 one server after
the other, minutes apart, and the machine's drift moved a round's ratio 0.78-1.63). Every
request decodes exactly `max_tokens` tokens (no stop IDs; `ignore_eos` for vLLM's server). One
engine runs at a time: the other is stopped or not started yet. Last, the proxy against vLLM's
OpenAI server built in the cell process on the cell's own engine (`engine_host`), batch by batch
in turn: one engine start for both.

Writes benchmarks/results/engine.json:
- tokens/s per concurrency (1, 8, 32) and `overhead_ratio_<n>` = gyre time / direct time, the
  median over `--rounds` x `--repeats` pairs of adjacent batches on one engine (every engine
  started afresh each round; goal <= 1.10; `per_round` keeps each round's own; tokens/s are of
  the pooled median times);
- `proxy_vs_vllm_server_ratio_32` (goal <= 1.15): proxy time / vLLM server time, the median
  over `--rounds` x `--repeats` pairs of adjacent batches; calls that ask for no logprobs, as the
  goal was set (gyre's path computes the sampled token's logprob of every call all the same;
  vLLM's server then skips that work); None with `vllm_server_error` when it cannot start.
  `proxy_vs_vllm_server_logprobs_ratio_32` (since 2026-12-06): the same calls asking for the
  sampled token's logprob (`logprobs: 0`), as a rollout does, so that both paths do that work;
  `proxy_s_32`, `vllm_server_s_32` and their `_logprobs_` twins are the seconds per batch;
- `proxy_vs_vllm_app_ratio_32` and `proxy_vs_vllm_app_logprobs_ratio_32` (since 2026-12-07):
  the same pairs against vLLM's OpenAI server as `vllm serve` builds it, served in the cell
  process on the cell's own `AsyncLLM` (`benchmarks.engine_host.vllm_openai_server`), so both
  paths meet one engine start: vLLM's server and the cell's engine driven directly differ by
  0.91-1.20 from one start to the next, as much as the gap measured. It runs on the cell's
  asyncio loop, not uvloop as `vllm serve` does (uvloop against asyncio was measured for the
  cell's own path only: no change beyond run-to-run spread). `proxy_beside_app_s_32`,
  `vllm_app_s_32` and their `_logprobs_` twins are the seconds per batch; None for all of them,
  with `vllm_app_error`, when that server cannot start;
- how much the cell's wire batched (`stream_frames_per_write`, `generate_requests_per_post`);
- CPU seconds per batch of 32 of the processes on each path: `direct_process_cpu_s_32` (the cell
  process driving its engine directly), `gyre_node_cpu_s_32` and `gyre_cell_cpu_s_32` (this
  process and the cell's main process on gyre's path), `proxy_process_cpu_s_32` and
  `vllm_server_process_cpu_s_32` (the process serving the OpenAI API on each path, its engine
  client included; `proxy_logprobs_process_cpu_s_32` ...: with logprobs asked); means over
  rounds, steadier than wall time on a shared machine;
- the scheduling facts the cell path depends on: `sched_autogroup_enabled` and
  `cells_share_node_sched_group`.

Run: .venv/bin/python -m benchmarks.bench_engine [--rounds 3] [--repeats 5] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import msgspec

from benchmarks.common import print_table, summarize, write_result
from gyre._heap import freeze_startup_heap
from gyre.config import EngineConfig, KVTransferConfig, ModelConfig
from gyre.engines import GenerateRequest, SamplingParams, collect

CONCURRENCY = (1, 8, 32)
HOST_MODULE = "benchmarks.engine_host"
"""The cell process the benchmark starts: gyre's cell plus the direct route."""
PROXY_HOST_MODULE = "benchmarks.proxy_host"
"""The process serving gyre's proxy in front of that cell, on trio like the node."""
SERVER_CONCURRENCY = 32
"""Concurrency of the proxy-vs-vLLM-server comparison."""
KINDS = (("plain", ""), ("logprobs", "_logprobs"))
"""The calls of that comparison, and the suffix of their keys: without and with `logprobs: 0`."""


async def _gyre(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> int:
    total = 0

    async def one(i: int, ids: list[int]) -> None:
        nonlocal total
        sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
        [c] = await collect(
            engine, GenerateRequest(request_id=f"{tag}-{i}", prompt_ids=ids, sampling=sampling)
        )
        total += len(c.token_ids)

    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):
            tg.start_soon(one, i, ids)
    return total


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, all threads) used so far by this process, or by `pid`."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _paired(
    engine, http: httpx.AsyncClient, cell_pid: int, prompts, repeats: int, max_tokens: int
) -> dict:
    """Warm both paths at every concurrency, then time `repeats` batches of each at each, the
    paths in turn (direct then gyre, then gyre then direct, ...) on the one engine: direct is
    `POST /bench/direct` (timed inside the cell process, `benchmarks.engine_host`), gyre is
    `engine` (the node's `CellClient`). Returns seconds per batch by path and concurrency, and
    the CPU seconds per batch at the highest concurrency of the direct path's process (the cell
    process), and of gyre's node (this process) and cell main process."""
    seconds: dict[str, dict[int, list[float]]] = {
        path: {n: [] for n in CONCURRENCY} for path in ("direct", "gyre")
    }
    cpu: dict[str, list[float]] = {"direct": [], "node": [], "cell": []}

    async def direct(n: int, tag: str, keep: bool = True) -> None:
        body = {"prompts": prompts[:n], "max_tokens": max_tokens, "tag": tag}
        r = await http.post("/bench/direct", json=body)
        r.raise_for_status()
        timed = r.json()
        if keep:
            seconds["direct"][n].append(timed["seconds"])
            cpu["direct"].append(timed["cpu_s"])

    async def gyre(n: int, tag: str, keep: bool = True) -> None:
        node0, cell0 = _cpu_s(), _cpu_s(cell_pid)
        t0 = time.perf_counter()
        tokens = await _gyre(engine, prompts[:n], max_tokens, tag)
        if keep:
            seconds["gyre"][n].append(time.perf_counter() - t0)
            cpu["node"].append(_cpu_s() - node0)
            cpu["cell"].append(_cpu_s(cell_pid) - cell0)
        assert tokens == n * max_tokens, tokens

    for n in CONCURRENCY:
        await direct(n, f"warm-d{n}", keep=False)
        await gyre(n, f"warm-g{n}", keep=False)
    for n in CONCURRENCY:
        if n == CONCURRENCY[-1]:  # CPU is counted at the highest concurrency only
            for samples in cpu.values():
                samples.clear()
        for r in range(repeats):
            for run in (direct, gyre) if r % 2 == 0 else (gyre, direct):
                await run(n, f"{run.__name__[0]}{n}-{r}")
    return {
        "direct_s": seconds["direct"],
        "gyre_s": seconds["gyre"],
        "cpu": {name: statistics.fmean(samples) for name, samples in cpu.items()},
    }


def _autogroup(pid: int) -> str | None:
    """The scheduling autogroup of `pid` ("/autogroup-123"), None where the kernel has none."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def sched_groups(cell_pid: int) -> dict[str, object]:
    """Whether this process (the node) and the cell with its vLLM processes share an autogroup."""
    try:
        enabled: int | None = int(Path("/proc/sys/kernel/sched_autogroup_enabled").read_text())
    except (OSError, ValueError):
        enabled = None
    node = _autogroup(os.getpid())
    cells = sorted(
        {g for g in map(_autogroup, [cell_pid, *_descendants(cell_pid)]) if g is not None}
    )
    return {
        "sched_autogroup_enabled": enabled,
        "node_autogroup": node,
        "cell_autogroups": cells,
        "cells_share_node_sched_group": node is not None and cells == [node],
        "node_session_id": os.getsid(0),
        "cell_session_id": os.getsid(cell_pid),
    }


async def _openai(
    http: httpx.AsyncClient, prompts, body: dict, keys: list[str] | None, max_tokens: int
) -> int:
    """`len(prompts)` concurrent `/v1/completions` calls; returns the completion tokens. A body
    asking for `logprobs` must get one per completion token back."""
    total = 0

    async def one(i: int, ids: list[int]) -> None:
        nonlocal total
        headers = {"Authorization": f"Bearer {keys[i]}"} if keys else {}
        r = await http.post(
            "/v1/completions",
            json={**body, "prompt": ids, "max_tokens": max_tokens},
            headers=headers,
        )
        r.raise_for_status()
        answer = r.json()
        if body.get("logprobs") is not None:
            returned = len(answer["choices"][0]["logprobs"]["token_logprobs"])
            assert returned == max_tokens, f"{returned} logprobs for {max_tokens} tokens"
        total += answer["usage"]["completion_tokens"]

    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):
            tg.start_soon(one, i, ids)
    return total


async def _time_served(
    served: dict[str, dict], prompts, repeats: int, max_tokens: int
) -> dict[str, dict[str, dict]]:
    """Batches of `len(prompts)` concurrent `/v1/completions` calls against each server of
    `served` ({name: {"url", "body", "keys", "pid", "pgid"}}), interleaved batch by batch: each
    repeat runs both kinds of call ("logprobs" asks for the sampled token's logprob, `logprobs: 0`,
    what a rollout needs of any server; gyre's proxy records it either way; "plain" does not) on
    every server, the orders reversed every other repeat, after one repeat that warms up. While
    one server is timed the others' process groups (`pgid`: their engines) are stopped (SIGSTOP),
    so an idle engine takes no CPU from the timed one and every pair of batches meets the same
    machine (`pgid` None: nothing to stop, as for two servers on one engine). Returns {name:
    {kind: {"s": seconds per batch, "cpu_s": mean CPU seconds per batch of the process serving
    the API (`pid`)}}}; the i-th batch of a kind is adjacent in time on every server."""
    kinds = {"logprobs": {"logprobs": 0}, "plain": {}}
    out = {name: {kind: {"s": [], "cpu": []} for kind in kinds} for name in served}
    # A connection a call. A keep-alive pool (64) made both servers slower, from the client's
    # side (2026-12-07, 2 rounds: proxy 0.35 -> 0.52 s a batch, vLLM's server 0.28 -> 0.39;
    # the proxy before a scripted engine 0.057 -> 0.115 s with its CPU unchanged)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    clients = {
        name: httpx.AsyncClient(base_url=server["url"], timeout=600, limits=limits)
        for name, server in served.items()
    }
    running = None
    try:
        for r in range(repeats + 1):  # the first repeat warms up
            for kind in kinds if r % 2 == 0 else reversed(kinds):
                for name in served if r % 2 == 0 else reversed(served):
                    if running != name:
                        for other, server in served.items():
                            if server["pgid"] is not None:
                                stop = signal.SIGCONT if other == name else signal.SIGSTOP
                                os.killpg(server["pgid"], stop)
                        running = name
                    server = served[name]
                    body = {**server["body"], **kinds[kind]}
                    cpu0, t0 = _cpu_s(server["pid"]), time.perf_counter()
                    tokens = await _openai(clients[name], prompts, body, server["keys"], max_tokens)
                    if r:
                        out[name][kind]["s"].append(time.perf_counter() - t0)
                        out[name][kind]["cpu"].append(_cpu_s(server["pid"]) - cpu0)
                    assert tokens == len(prompts) * max_tokens, tokens
    finally:
        for server in served.values():
            if server["pgid"] is not None:
                os.killpg(server["pgid"], signal.SIGCONT)
        for http in clients.values():
            await http.aclose()
    return {
        name: {k: {"s": v["s"], "cpu_s": statistics.fmean(v["cpu"])} for k, v in kinds_.items()}
        for name, kinds_ in out.items()
    }


@asynccontextmanager
async def _proxy_host(
    cell_url: str, cell_pid: int, model_dir: Path, config: EngineConfig, keys: int, log_path: Path
) -> AsyncIterator[dict]:
    """gyre's TitoProxy in a process of its own (`benchmarks.proxy_host`, on trio like the node)
    in front of the cell at `cell_url`; yields it as `_time_served` takes a server, with the
    process group of the cell (`cell_pid`) as the one to stop; its CPU is the proxy process's."""
    port_file = log_path.with_suffix(".port")
    port_file.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        PROXY_HOST_MODULE,
        "--cell-url",
        cell_url,
        "--model",
        str(model_dir),
        "--engine-config",
        msgspec.json.encode(config).decode(),
        "--keys",
        str(keys),
        "--port-file",
        str(port_file),
    ]
    with open(log_path, "ab") as log:  # like the node: the cell's session
        host = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + config.startup_timeout_s
        while not port_file.exists():
            if host.poll() is not None or time.monotonic() > deadline:
                tail = " | ".join(log_path.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"{PROXY_HOST_MODULE} did not start: {tail}")
            await anyio.sleep(0.2)
        served = json.loads(port_file.read_text())
        yield {
            "url": f"http://127.0.0.1:{served['port']}",
            "body": {"model": served["model"], "temperature": 1.0},
            "keys": served["keys"],
            "pid": host.pid,
            "pgid": os.getpgid(cell_pid),
        }
    finally:
        host.terminate()
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(host.wait, 30)
            except subprocess.TimeoutExpired:
                host.kill()
                host.wait()


def _vllm_served(port: int, model: str, *, pid: int, pgid: int | None) -> dict:
    """A vLLM OpenAI server on 127.0.0.1:`port` serving `model`, as `_time_served` takes it:
    no keys, `ignore_eos` so every call decodes `max_tokens`; `pid` serves the API, `pgid` is
    the process group to stop while another server is timed (None: nothing to stop)."""
    body = {"model": model, "temperature": 1.0, "ignore_eos": True}
    return {"url": f"http://127.0.0.1:{port}", "body": body, "keys": None, "pid": pid, "pgid": pgid}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@asynccontextmanager
async def _vllm_server(
    model_dir: Path, config: EngineConfig, log_path: Path
) -> AsyncIterator[tuple[dict | None, str | None]]:
    """vLLM's own OpenAI server (`vllm.entrypoints.openai.api_server`, its own engine start; its
    own process group, in this session, like a cell) on the same model and engine settings;
    yields (the server as `_time_served` takes it, None), CPU being its API server process's
    (EngineCore and the worker are its children, not counted), or (None, why it did not
    start)."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        config.dtype,
        "--max-model-len",
        str(config.max_model_len),
        "--block-size",
        str(config.block_size),
        "--logprobs-mode",
        "processed_logprobs",
        "--seed",
        "0",
        "--disable-log-stats",
        "--disable-uvicorn-access-log",
        *(
            ["--kv-cache-memory-bytes", str(config.kv_cache_memory_bytes)]
            if config.kv_cache_memory_bytes
            else []
        ),
        *(["--enforce-eager"] if config.enforce_eager else []),
        *([] if config.enable_prefix_caching else ["--no-enable-prefix-caching"]),
    ]
    with open(log_path, "ab") as log:
        server = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0
        )
    try:
        deadline = time.monotonic() + config.startup_timeout_s
        error = None
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                if server.poll() is not None:
                    tail = log_path.read_text(errors="replace").splitlines()[-15:]
                    error = f"exited with code {server.returncode}: " + " | ".join(tail)
                    break
                if time.monotonic() > deadline:
                    error = f"not ready within startup_timeout_s={config.startup_timeout_s}"
                    break
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass  # not listening yet
                await anyio.sleep(0.5)
        if error is not None:
            yield None, error
        else:
            yield _vllm_served(port, str(model_dir), pid=server.pid, pgid=server.pid), None
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(server.pid, signal.SIGCONT)  # a stopped process takes no SIGTERM
                os.killpg(server.pid, sig)
                server.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


async def _round(
    model_dir: Path,
    config: EngineConfig,
    prompts: list[list[int]],
    repeats: int,
    max_tokens: int,
    log_dir: Path,
) -> dict:
    """One round: one cell process (`benchmarks.engine_host`), timed direct and through gyre's
    protocol in turn, alone. Then the cell stays, stopped, while vLLM's own server starts, and
    the two OpenAI servers (gyre's proxy + that cell; vLLM's server) are timed batch by batch in
    turn (`_time_served`), each stopped while the other runs. An idle vLLM engine left running
    beside the measured one took 2-7x off the measured path on 2 cores (2026-12-01: gyre 55 tok/s
    at concurrency 1 with the direct engine alive, 344 tok/s alone); until 2026-12-07 the two
    servers ran one after the other, a minute or more apart, and a round's ratio moved 0.78-1.63
    with the machine's speed, while paired batches of one round, then, gave 1.21-1.29. Last,
    vLLM's server is gone and the proxy is timed against vLLM's OpenAI server built in the cell
    process on the same engine (`POST /bench/vllm_app`), batch by batch in turn, nothing
    stopped."""
    from gyre.cell.client import CellClient
    from gyre.cell.spawn import spawn_cell, wait_cell_ready
    from gyre.cell.wire import cell_secret

    cell = spawn_cell(model_dir, config, log_path=log_dir / "cell.log", module=HOST_MODULE)
    try:
        url = await anyio.to_thread.run_sync(wait_cell_ready, cell, config.startup_timeout_s)
        groups = sched_groups(cell.process.pid)
        auth = {"Authorization": f"Bearer {cell_secret()}"}
        async with (
            CellClient(url, config) as engine,
            httpx.AsyncClient(base_url=url, headers=auth, timeout=600) as http,
        ):
            paired = await _paired(engine, http, cell.process.pid, prompts, repeats, max_tokens)
            hosted = _proxy_host(
                url, cell.process.pid, model_dir, config, SERVER_CONCURRENCY, log_dir / "proxy.log"
            )
            async with hosted as proxy:
                os.killpg(proxy["pgid"], signal.SIGSTOP)  # the cell's engine waits, stopped
                try:
                    async with _vllm_server(model_dir, config, log_dir / "vllm.log") as started:
                        server, server_error = started
                        served = {"proxy": proxy} | ({"server": server} if server else {})
                        timed = await _time_served(
                            served, prompts[:SERVER_CONCURRENCY], repeats, max_tokens
                        )
                finally:
                    os.killpg(proxy["pgid"], signal.SIGCONT)
                # vLLM's OpenAI server on the cell's own engine: both paths meet one engine start
                started = await http.post("/bench/vllm_app")
                one_engine, app_error = {"proxy": None, "app": None}, None
                if started.status_code != 200:
                    app_error = f"{started.status_code}: {started.text}"
                else:
                    app = started.json()
                    beside = {
                        "proxy": {**proxy, "pgid": None},
                        "app": _vllm_served(
                            app["port"], app["model"], pid=cell.process.pid, pgid=None
                        ),
                    }
                    one_engine = await _time_served(
                        beside, prompts[:SERVER_CONCURRENCY], repeats, max_tokens
                    )
            streamed = await engine.cell_statistics()
    finally:
        await anyio.to_thread.run_sync(cell.stop)
    return {
        "direct_s": paired["direct_s"],
        "gyre_s": paired["gyre_s"],
        "proxy": timed["proxy"],
        "server": timed.get("server"),
        "server_error": server_error,
        "beside": one_engine["proxy"],
        "app": one_engine["app"],
        "app_error": app_error,
        "cpu": paired["cpu"],
        "streamed": streamed,
        "groups": groups,
    }


def _median_of_pairs(a: list[float], b: list[float]) -> float:
    """Median of a[i] / b[i] over pairs of batches adjacent in time."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _paired_ratio(rounds: list[dict], n: int) -> float:
    """Median over every pair (the same repeat of one round: adjacent batches on one engine) of
    gyre time / direct time at concurrency `n`. A ratio of medians pooled over rounds would mix
    engine starts of different speeds (one round's direct batches took 0.13 s, another's 0.19)."""
    return _median_of_pairs(
        [t for r in rounds for t in r["gyre_s"][n]], [t for r in rounds for t in r["direct_s"][n]]
    )


async def main_async(repeats: int, max_tokens: int, rounds: int) -> None:
    from gyre.model import init_model_dir

    root = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    model_config = ModelConfig(seed=0)
    model_dir = init_model_dir(root / "model", model_config)
    # no KV connector (on by default since d5aaa60): vLLM's own server below runs without one, and
    # the direct path would carry it in this process; this measures the transport, not migration
    config = EngineConfig(max_model_len=1024, kv_transfer=KVTransferConfig(connector="none"))
    prompts = [
        [5 + (7 * i + j) % 500 for j in range(32 + 8 * (i % 4))] for i in range(max(CONCURRENCY))
    ]
    # This process stands in for the node (its CellClient is the gyre path's client), so its
    # start-up heap (torch, transformers) is frozen as the node's is: a full collection walking it
    # stops the client for 0.2-0.4 s, and batches through the client allocate more than direct ones
    freeze_startup_heap()
    # Rounds, each starting every engine afresh: one engine's whole life is one sample of its
    # speed (identical runs of one round moved the ratios +-10%, 2026-12-02..04), so a median over
    # several starts of each path is the steadier comparison. Every ratio is also kept per round.
    done = [
        await _round(model_dir, config, prompts, repeats, max_tokens, root) for _ in range(rounds)
    ]
    direct_s = {n: [t for r in done for t in r["direct_s"][n]] for n in CONCURRENCY}
    gyre_s = {n: [t for r in done for t in r["gyre_s"][n]] for n in CONCURRENCY}
    server_error = next((r["server_error"] for r in done if r["server_error"]), None)
    groups = done[0]["groups"]
    rows, numbers = [], {}
    for n in CONCURRENCY:
        d, g = summarize(direct_s[n]), summarize(gyre_s[n])
        numbers[f"direct_s_{n}"] = d
        numbers[f"gyre_s_{n}"] = g
        numbers[f"direct_tokens_per_s_{n}"] = n * max_tokens / d["median"]
        numbers[f"gyre_tokens_per_s_{n}"] = n * max_tokens / g["median"]
        numbers[f"overhead_ratio_{n}"] = _paired_ratio(done, n)
        rows.append(
            {
                "concurrency": n,
                "direct tok/s": n * max_tokens / d["median"],
                "gyre tok/s": n * max_tokens / g["median"],
                "gyre/direct time (paired)": numbers[f"overhead_ratio_{n}"],
            }
        )
    n = SERVER_CONCURRENCY
    # Both servers get the same requests: "plain" ones (the goal's) and "logprobs" ones (what a
    # rollout needs of any server; gyre's path computes the logprob for every call either way)
    served = {
        "proxy": [r["proxy"] for r in done],
        "vllm_server": None if server_error else [r["server"] for r in done],
    }
    for kind, suffix in KINDS:
        for name, timed in served.items():
            numbers[f"{name}{suffix}_s_{n}"] = (
                None if timed is None else summarize([t for r in timed for t in r[kind]["s"]])
            )
        numbers[f"proxy_vs_vllm_server{suffix}_ratio_{n}"] = (
            None
            if server_error is not None
            else _median_of_pairs(
                [t for r in done for t in r["proxy"][kind]["s"]],
                [t for r in done for t in r["server"][kind]["s"]],
            )
        )
    numbers["vllm_server_error"] = server_error
    app_error = next((r["app_error"] for r in done if r["app_error"] is not None), None)
    numbers["vllm_app_error"] = app_error
    for kind, suffix in KINDS:
        keys = [f"proxy_beside_app{suffix}_s_{n}", f"vllm_app{suffix}_s_{n}"]
        ratio_key = f"proxy_vs_vllm_app{suffix}_ratio_{n}"
        if app_error is not None:
            numbers.update(dict.fromkeys([*keys, ratio_key]))
            continue
        beside = [t for r in done for t in r["beside"][kind]["s"]]
        app = [t for r in done for t in r["app"][kind]["s"]]
        numbers[keys[0]], numbers[keys[1]] = summarize(beside), summarize(app)
        numbers[ratio_key] = _median_of_pairs(beside, app)
    # CPU seconds per batch of the process serving the API on each path: gyre's proxy process
    # (its CellClient included; the cell's main process is not counted) and vLLM's API server
    # process (its engine client included; EngineCore and the worker are not)
    for kind, suffix in KINDS:
        for name, timed in served.items():
            numbers[f"{name}{suffix}_process_cpu_s_{n}"] = (
                None if timed is None else statistics.fmean(r[kind]["cpu_s"] for r in timed)
            )
    # request deltas per write on the cell's delta stream (1.0: no batching), over the cell's run
    # CPU seconds per batch of 32: the direct path's one process (client + AsyncLLM's output
    # handling) against gyre's node (client) and cell main process (server + AsyncLLM's)
    top = CONCURRENCY[-1]
    for key, name in (("direct_process", "direct"), ("gyre_node", "node"), ("gyre_cell", "cell")):
        numbers[f"{key}_cpu_s_{top}"] = statistics.fmean(r["cpu"][name] for r in done)
    frames = sum(r["streamed"].stream_frames for r in done)
    writes = sum(r["streamed"].stream_writes for r in done)
    numbers["stream_frames_per_write"] = frames / max(writes, 1)
    # generate requests per `POST /generate` (1.0: one HTTP exchange per request), same run
    requests = sum(r["streamed"].generate_requests for r in done)
    posts = sum(r["streamed"].generate_posts for r in done)
    numbers["generate_requests_per_post"] = requests / max(posts, 1)
    # the same ratios within each round (its own engine starts), to show the spread
    numbers["per_round"] = [
        {
            **{f"overhead_ratio_{n}": _paired_ratio([r], n) for n in CONCURRENCY},
            **{
                f"proxy_vs_vllm_server{suffix}_ratio_{SERVER_CONCURRENCY}": None
                if r["server"] is None
                else _median_of_pairs(r["proxy"][kind]["s"], r["server"][kind]["s"])
                for kind, suffix in KINDS
            },
            **{
                f"proxy_vs_vllm_app{suffix}_ratio_{SERVER_CONCURRENCY}": None
                if r["app"] is None
                else _median_of_pairs(r["beside"][kind]["s"], r["app"][kind]["s"])
                for kind, suffix in KINDS
            },
        }
        for r in done
    ]
    numbers.update(groups)
    path = write_result(
        "engine",
        {
            "model": "gyre tiny qwen2 (seed 0)",
            "model_config": {
                "hidden_size": model_config.hidden_size,
                "num_hidden_layers": model_config.num_hidden_layers,
                "vocab_size": model_config.vocab_size,
            },
            "max_tokens": max_tokens,
            "repeats": repeats,
            "rounds": rounds,
            "concurrency": list(CONCURRENCY),
            "dtype": config.dtype,
            "kv_connector": config.kv_transfer.connector,
            "server_concurrency": SERVER_CONCURRENCY,
        },
        numbers,
    )
    print_table("engine throughput: gyre protocol vs vLLM direct (medians)", rows)
    for _, suffix in KINDS:
        ratio = numbers[f"proxy_vs_vllm_server{suffix}_ratio_{n}"]
        print(
            f"proxy+cell vs vLLM's OpenAI server at {n}{suffix.replace('_', ' ')}: "
            f"{ratio if ratio is not None else server_error}"
        )
        ratio = numbers[f"proxy_vs_vllm_app{suffix}_ratio_{n}"]
        label = f"{n}{suffix.replace('_', ' ')}"
        shown = app_error if ratio is None else ratio
        print(f"proxy+cell vs vLLM's server on the cell's engine at {label}: {shown}")
    print({k: groups[k] for k in ("sched_autogroup_enabled", "cells_share_node_sched_group")})
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--rounds", type=int, default=3, help="fresh starts of every engine; samples are pooled"
    )
    args = parser.parse_args()
    if args.repeats < 1 or args.rounds < 1 or args.max_tokens < 1:
        parser.error("--repeats, --rounds and --max-tokens must be >= 1")
    anyio.run(main_async, args.repeats, args.max_tokens, args.rounds, backend="asyncio")


if __name__ == "__main__":
    main()
