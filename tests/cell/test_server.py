"""A cell process and its client: the wire, errors, aborts and versions, on the scripted backend.

The same client and server carry the vLLM backend (tests/engines/test_vllm.py); here the cell hosts
the scripted engine so the transport is tested in seconds.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from gyre.cell.client import CellClient
from gyre.cell.spawn import spawn_cell, wait_cell_ready
from gyre.cell.wire import (
    CELL_SECRET_ENV,
    Frame,
    FrameBatch,
    FrameReader,
    Health,
    cell_secret,
    encode_frame,
)
from gyre.config import EngineConfig
from gyre.engines import GenerateRequest, InferenceEngine, SamplingParams, collect
from gyre.engines.protocol import TokenDelta
from gyre.engines.scripted import ScriptedEngine
from gyre.errors import ContextLengthError, EngineUnavailableError, InvalidRequestError

pytestmark = pytest.mark.anyio

CONFIG = EngineConfig(backend="scripted", max_model_len=64, request_timeout_s=30.0)


@pytest.fixture(scope="module")
def scripted_cell(tmp_path_factory):
    process = spawn_cell("unused", CONFIG, log_path=tmp_path_factory.mktemp("cell") / "cell.log")
    url = wait_cell_ready(process, 60)
    yield url
    assert process.stop() == 0


@pytest.fixture
async def engine(scripted_cell):
    async with CellClient(scripted_cell, CONFIG) as client:
        yield client


def req(rid: str, prompt=(5, 6, 7), **sampling) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, prompt_ids=list(prompt), sampling=SamplingParams(**sampling)
    )


def test_frame_reader_reassembles_split_frames() -> None:
    frames = [
        Frame(
            delta=TokenDelta(index=i, token_ids=[i, 7], logprobs=[-0.5, -1.5], versions=[3, 3]),
            tag=i,
        )
        for i in range(3)
    ]
    batches = [FrameBatch(frames[:2]), FrameBatch(frames[2:])]
    data = b"".join(encode_frame(b) for b in batches)
    reader = FrameReader(FrameBatch)
    got = []
    for i in range(0, len(data), 5):
        got += reader.feed(data[i : i + 5])
    assert got == batches and reader.pending == 0


async def test_client_implements_protocol(engine) -> None:
    assert isinstance(engine, InferenceEngine)


async def test_generate_n2_through_the_cell_equals_scripted_rule(engine) -> None:
    from gyre.engines.scripted import ScriptedEngine

    local = await collect(ScriptedEngine(max_model_len=64), req("x", n=2, seed=7, max_tokens=6))
    remote = await collect(engine, req("x", n=2, seed=7, max_tokens=6))
    assert remote == local


@pytest.mark.parametrize(
    ("request_", "error", "named"),
    [
        (req("bad1", prompt=[]), InvalidRequestError, "prompt_ids is empty"),
        (req("bad2", prompt=[5, 2000]), InvalidRequestError, "2000"),
        (req("bad3", prompt=[5] * 64), ContextLengthError, "64 tokens"),
        (req("bad4", max_tokens=-1), InvalidRequestError, "max_tokens=-1"),
    ],
)
async def test_errors_cross_the_wire_typed(engine, request_, error, named) -> None:
    with pytest.raises(error, match=named):
        await collect(engine, request_)
    assert (await collect(engine, req("ok-after")))[0].token_ids


async def test_abort_before_arrival_and_versions_after_load(engine) -> None:
    assert await engine.abort("ghost") == []
    [c] = await collect(engine, req("ghost"))
    assert (c.token_ids, c.finish_reason) == ([], "abort")
    await engine.load_weights("unused", 4)
    [c] = await collect(engine, req("v4"))
    assert set(c.versions) == {4}
    assert engine.statistics().weight_version == 4


async def test_pause_is_reported_as_unavailable(engine) -> None:
    await engine.pause()
    try:
        with pytest.raises(EngineUnavailableError, match="paused"):
            await collect(engine, req("paused"))
    finally:
        await engine.resume()


def test_a_cell_freezes_its_start_up_heap_before_it_reports_ready(tmp_path) -> None:
    """`gyre._heap.freeze_startup_heap` runs before `/health` says ready, so a full collection in
    the loop serving requests never walks the imports' objects (the log line gives the count)."""
    process = spawn_cell("unused", CONFIG, log_path=tmp_path / "cell.log")
    try:
        wait_cell_ready(process, 60)
        log = (tmp_path / "cell.log").read_text()
    finally:
        assert process.stop() == 0
    [frozen] = re.findall(r"cell ready on .*; (\d+) start-up objects frozen", log)
    assert int(frozen) > 10_000  # aiohttp, msgspec and gyre's modules: ~10^4-10^5 objects


async def test_dead_cell_is_unavailable_not_a_hang(tmp_path) -> None:
    process = spawn_cell("unused", CONFIG, log_path=tmp_path / "cell.log")
    url = await anyio.to_thread.run_sync(wait_cell_ready, process, 60)
    assert (
        not process.port_file.parent.exists()
    )  # read, then removed: no /tmp/gyre-cell-* per cell left
    async with CellClient(url, CONFIG) as client:
        process.process.kill()
        process.process.wait()
        with pytest.raises(EngineUnavailableError):
            await collect(client, req("to-dead"))


async def test_one_cell_failing_to_start_stops_the_others_at_once(tmp_path, monkeypatch) -> None:
    """`open_cells`: a rank that dies during start-up fails the start with its own error and the
    other ranks are stopped, without waiting out their start-up timeout (a rank blocked on a missing
    gradient-group peer never becomes ready). Before the fix this took the full timeout."""
    import gyre.cell.spawn as cell_spawn

    spawned: list[cell_spawn.CellProcess] = []

    def spawn(model_dir, config, *, log_path, **_):  # rank 0 never becomes ready, rank 1 exits 3
        code = "import time; time.sleep(600)" if not spawned else "raise SystemExit(3)"
        process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        spawned.append(
            cell_spawn.CellProcess(
                process=process,
                port_file=tmp_path / f"port-{len(spawned)}",
                log_path=tmp_path / "no.log",
            )
        )
        return spawned[-1]

    monkeypatch.setattr(cell_spawn, "spawn_cell", spawn)
    config = EngineConfig(backend="scripted", startup_timeout_s=60.0)
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError, match="exited with code 3"):
        async with cell_spawn.open_cells(2, "unused", config, log_dir=tmp_path):
            pytest.fail("no cell started, so nothing may be yielded")
    # a liveness bound, not a speed one: rank 0 can only end its wait by being stopped or at its
    # 60 s deadline (before the fix, its thread ran to the deadline and the error came after it)
    assert time.monotonic() - started < config.startup_timeout_s / 2
    assert [c.process.returncode for c in spawned][1] == 3
    assert spawned[0].process.poll() is not None  # the waiting rank was stopped, not left running


def test_failed_start_reports_the_log(tmp_path) -> None:
    config = EngineConfig(backend="vllm", startup_timeout_s=120)
    process = spawn_cell(tmp_path / "no-model-here", config, log_path=tmp_path / "cell.log")
    with pytest.raises(EngineUnavailableError, match="failed to start|exited"):
        wait_cell_ready(process, 120)
    process.stop()
    assert not process.port_file.parent.exists()


@pytest.mark.slow
def test_stop_after_kill9_reaps_the_engine_processes(tmp_path, tiny_model_dir) -> None:
    import os
    import signal
    import time

    from gyre.sandbox.supervisor import live_descendants
    from tests.conftest import require_vllm

    require_vllm()
    config = EngineConfig(max_model_len=256, startup_timeout_s=300)
    process = spawn_cell(tiny_model_dir, config, log_path=tmp_path / "cell.log")
    wait_cell_ready(process, 300)
    engine_pids = live_descendants(process.process.pid)
    assert engine_pids  # vLLM's engine core (and its worker) run under the cell
    os.kill(process.process.pid, signal.SIGKILL)
    process.stop()
    time.sleep(0.5)
    alive = [
        pid
        for pid in engine_pids
        if os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    ]
    assert alive == []


@pytest.mark.slow
def test_sigterm_during_start_up_takes_the_cell_and_its_group_at_once(
    tmp_path, tiny_model_dir
) -> None:
    """A node killed while its cell starts sends SIGTERM (PR_SET_PDEATHSIG): the cell used to finish
    its vLLM start-up first (about 30 s here, minutes for a large model) as an orphan."""
    import os
    import signal
    import time

    from tests.conftest import require_vllm

    require_vllm()
    process = spawn_cell(
        tiny_model_dir,
        EngineConfig(max_model_len=256, startup_timeout_s=300),
        log_path=tmp_path / "cell.log",
    )
    while not process.port_file.exists():  # written once serving, before the engine starts
        assert process.process.poll() is None, (tmp_path / "cell.log").read_text()
        time.sleep(0.05)
    os.kill(process.process.pid, signal.SIGTERM)
    assert (
        process.process.wait(timeout=120) == -signal.SIGKILL
    )  # its own group kill, not a finished start
    assert "cell ready" not in (tmp_path / "cell.log").read_text()
    assert live_in_group(process.process.pid) == []
    process.stop()


def live_in_group(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group `pgid`, from /proc."""
    live = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        if fields[2] == str(pgid) and fields[0] != "Z":
            live.append(int(entry))
    return live


@pytest.mark.slow
def test_sleep_mode_on_cpu_is_refused_with_the_reason(tmp_path, tiny_model_dir) -> None:
    from tests.conftest import require_vllm

    require_vllm()
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: sleep mode is supported here (see the gpu test)")
    process = spawn_cell(
        tiny_model_dir,
        EngineConfig(max_model_len=256, sleep_mode=True),
        log_path=tmp_path / "c.log",
    )
    with pytest.raises(EngineUnavailableError, match="[Ss]leep mode"):
        wait_cell_ready(process, 300)
    process.stop()


@pytest.mark.gpu
async def test_gpu_pause_sleeps_and_frees_memory_then_resume_serves(
    tmp_path, tiny_model_dir
) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: vLLM sleep mode is GPU-only")
    from gyre.cell.spawn import open_cell

    config = EngineConfig(max_model_len=512, sleep_mode=True)
    async with open_cell(tiny_model_dir, config, log_path=tmp_path / "c.log") as engine:
        before = torch.cuda.mem_get_info()[0]
        await engine.pause()
        assert torch.cuda.mem_get_info()[0] > before  # the cell handed accelerator memory back
        await engine.resume()
        [c] = await collect(engine, req("after-wake", max_tokens=4))
        assert len(c.token_ids) == 4


async def test_requests_without_the_node_secret_are_refused(
    scripted_cell, engine: InferenceEngine
) -> None:
    """An agent on the node reaches the cell's loopback port but not its secret: 401, no effect."""
    before = engine.statistics().weight_version
    async with httpx.AsyncClient(base_url=scripted_cell) as http:
        for headers in (
            {},
            {"Authorization": "Bearer " + "0" * 64},
            {"Authorization": cell_secret()},
        ):
            for method, path in (
                ("GET", "/health"),
                ("POST", "/load_weights"),
                ("POST", "/shutdown"),
            ):
                response = await http.request(method, path, headers=headers, content=b"")
                assert response.status_code == 401 and CELL_SECRET_ENV in response.text
    await engine.refresh_statistics()  # the client's own requests still pass; the cell is up
    assert engine.statistics().weight_version == before
    env = {k: v for k, v in os.environ.items() if k != CELL_SECRET_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "gyre.cell.server", "--model", "m", "--port-file", "p"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"${CELL_SECRET_ENV} is not set" in done.stderr


# -- the delta stream, on an in-process cell whose engine steps when the test says ---------------


class SteppedEngine(ScriptedEngine):
    """Each request emits one token per `advance()`, all running requests in the same loop turn
    (as vLLM's output handler wakes them), then `length`; `abort` is recorded."""

    def __init__(self) -> None:
        super().__init__(max_model_len=64)
        self.aborted: list[str] = []
        self.waiting = 0
        self.emitted = 0
        """Tokens yielded so far, all requests."""
        self._step = asyncio.Event()

    def advance(self) -> None:
        step, self._step = self._step, asyncio.Event()
        step.set()

    async def generate(self, request: GenerateRequest):
        for i in range(request.sampling.max_tokens):
            step = self._step
            self.waiting += 1
            try:
                await step.wait()
            finally:
                self.waiting -= 1
            if request.request_id in self.aborted:
                yield TokenDelta(
                    index=0, token_ids=[], logprobs=[], versions=[], finish_reason="abort"
                )
                return
            self.emitted += 1
            yield TokenDelta(index=0, token_ids=[5 + i], logprobs=[-1.0], versions=[0])
        yield TokenDelta(index=0, token_ids=[], logprobs=[], versions=[], finish_reason="length")

    async def abort(self, request_id: str) -> list:
        self.aborted.append(request_id)
        return []


@pytest.fixture
async def stepped_cell():
    """(engine, cell, url): a cell's routes served in this process (asyncio) over
    `SteppedEngine`."""
    from aiohttp import web

    from gyre.cell.api import CellAPI, cell_app

    cell = CellAPI()
    cell.engine, cell.health = SteppedEngine(), Health(state="ready")
    runner = web.AppRunner(cell_app(cell), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield cell.engine, cell, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        cell.streams.close_all()
        await runner.cleanup()


async def wait_for(condition) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.005)


async def first_step(engine: SteppedEngine, deltas) -> TokenDelta:
    """Advance `engine` once the request of `deltas` waits for its first step; its first delta."""
    got: list[TokenDelta] = []

    async def take_first() -> None:
        got.append(await anext(deltas))

    async with anyio.create_task_group() as tg:
        tg.start_soon(take_first)
        await wait_for(lambda: engine.waiting == 1)
        engine.advance()
    return got[0]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_one_write_per_engine_step_carries_every_request(stepped_cell) -> None:
    """8 concurrent requests: each engine step goes out as one `FrameBatch` of 8 frames (the old
    per-request HTTP streams cost 8 writes and 8 client wake-ups a step)."""
    engine, cell, url = stepped_cell
    got: dict[int, list] = {}
    async with CellClient(url, CONFIG) as client, anyio.create_task_group() as tg:
        for i in range(8):

            async def one(i=i) -> None:
                got[i] = await collect(client, req(f"s{i}", max_tokens=3))

            tg.start_soon(one)
        for step in range(3):
            await wait_for(lambda: engine.waiting == 8)
            writes = cell.streams.writes
            engine.advance()
            await wait_for(lambda: cell.streams.writes > writes)  # noqa: B023 awaited in this step
            await anyio.sleep(0.05)  # a second write for the same step would come now
            assert cell.streams.writes == writes + 1, step
    assert [c.token_ids for i in range(8) for c in got[i]] == [[5, 6, 7]] * 8
    assert (cell.streams.writes, cell.streams.frames) == (
        3,
        8 * 4,
    )  # the finish rides with the last token
    assert cell.cell_statistics().stream_frames == 32 and cell.cell_statistics().streams_open == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_steps_within_the_coalescing_window_go_out_in_one_write(
    stepped_cell, monkeypatch
) -> None:
    """A request's first delta and its finish are written at once; the engine steps between them
    wait up to `_COALESCE_S` and go out with the next write (the client merges them per choice)."""
    from contextlib import aclosing

    from gyre.cell import stream as cell_stream

    monkeypatch.setattr(cell_stream, "_COALESCE_S", 30.0)  # only an urgent frame ends a wait
    engine, cell, url = stepped_cell
    async with CellClient(url, CONFIG) as client:
        async with aclosing(client.generate(req("c", max_tokens=4))) as deltas:
            writes = cell.streams.writes
            first = await first_step(engine, deltas)
            assert cell.streams.writes == writes + 1  # the first token went out at once
            for emitted in (2, 3):  # two more tokens, held by the window
                await wait_for(lambda: engine.waiting == 1)
                engine.advance()
                await wait_for(lambda: engine.emitted == emitted)  # noqa: B023 awaited here
            await wait_for(lambda: engine.waiting == 1)
            await anyio.sleep(0.05)
            assert cell.streams.writes == writes + 1
            engine.advance()  # the last token and the finish: out at once, with the held two
            rest = [d async for d in deltas]
    assert cell.streams.writes == writes + 2 and cell.streams.frames == 5  # 3 tokens, a finish
    assert (first.token_ids, first.finish_reason) == ([5], None)
    assert rest == [
        TokenDelta(
            index=0,
            token_ids=[6, 7, 8],
            logprobs=[-1.0] * 3,
            versions=[0] * 3,
            finish_reason="length",
        )
    ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_closed_idle_stream_is_dropped(stepped_cell, monkeypatch) -> None:
    from gyre.cell import stream as cell_stream

    monkeypatch.setattr(cell_stream, "_IDLE_CHECK_S", 0.05)
    engine, cell, url = stepped_cell
    async with CellClient(url, CONFIG) as client:
        await client._open_stream()
        assert cell.streams.open == 1
    await wait_for(lambda: cell.streams.open == 0)
    assert cell.streams.lost == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_consumer_that_leaves_aborts_and_a_lost_stream_aborts_all(stepped_cell) -> None:
    from contextlib import aclosing

    from gyre.cell.wire import StreamedGenerate, encode

    engine, cell, url = stepped_cell
    async with CellClient(url, CONFIG) as client:

        async def leave_after_one() -> None:
            async with aclosing(client.generate(req("leaves", max_tokens=5))) as deltas:
                async for _ in deltas:
                    break

        async with anyio.create_task_group() as tg:
            tg.start_soon(leave_after_one)
            await wait_for(lambda: engine.waiting == 1)
            engine.advance()
        assert engine.aborted == ["leaves"]
        [c] = await collect(
            client, req("leaves", max_tokens=0)
        )  # same ID again: a new tag, a new request
        assert c.finish_reason == "length"
    engine.advance()  # the aborted request ends ("abort"); its write finds the client gone
    await wait_for(lambda: engine.waiting == 0 and cell.streams.open == 0)
    headers = {"Authorization": f"Bearer {cell_secret()}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as http:
        async with http.stream("GET", "/stream", params={"id": "raw"}) as stream:
            assert stream.status_code == 200
            refused = await http.post("/stream", params={"id": "raw"})
            assert refused.status_code == 405
            async with anyio.create_task_group() as tg:
                body = encode(
                    [StreamedGenerate(stream="raw", tag=1, request=req("orphan", max_tokens=5))]
                )
                tg.start_soon(functools.partial(http.post, "/generate", content=body))
                await wait_for(lambda: engine.waiting == 1)
                engine.advance()
        await wait_for(lambda: engine.waiting == 1)
        engine.advance()  # its next write finds the client gone
        await wait_for(lambda: "orphan" in engine.aborted)
        unknown = await http.post(
            "/generate", content=encode([StreamedGenerate(stream="gone", tag=1, request=req("x"))])
        )
        assert unknown.status_code == 503 and b"no open delta stream" in unknown.content


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_consumer_behind_the_engine_gets_the_steps_it_missed_as_one_delta(
    stepped_cell,
) -> None:
    """Frames queued while the consumer was away come out merged: one delta with every token of
    the steps it missed (its logprobs and versions per token), the finish on it."""
    from contextlib import aclosing

    engine, cell, url = stepped_cell
    async with CellClient(url, CONFIG) as client:
        async with aclosing(client.generate(req("slow", max_tokens=4))) as deltas:
            first = await first_step(engine, deltas)
            assert (first.token_ids, first.finish_reason) == ([5], None)
            for _ in range(3):  # three more steps and the finish, nobody reading
                await wait_for(lambda: engine.waiting == 1)
                writes = cell.streams.writes
                engine.advance()
                await wait_for(lambda: cell.streams.writes > writes)  # noqa: B023
            rest = [d async for d in deltas]
    assert rest == [
        TokenDelta(
            index=0,
            token_ids=[6, 7, 8],
            logprobs=[-1.0] * 3,
            versions=[0] * 3,
            finish_reason="length",
        )
    ]
    assert engine.aborted == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_burst_of_requests_is_posted_in_one_batch(stepped_cell) -> None:
    """8 requests made together cost one `POST /generate` (each was an HTTP exchange and a TCP
    connection of its own), and each still gets its own tokens."""
    engine, cell, url = stepped_cell
    got: dict[int, list] = {}
    async with CellClient(url, CONFIG) as client:
        await client._open_stream()
        async with anyio.create_task_group() as tg:
            for i in range(8):

                async def one(i=i) -> None:
                    got[i] = await collect(client, req(f"b{i}", max_tokens=2))

                tg.start_soon(one)
            for step in range(2):
                await wait_for(lambda: engine.waiting == 8)
                engine.advance()
                await wait_for(lambda: cell.streams.frames >= 8 * (step + 1))  # noqa: B023
    assert [(c.token_ids, c.finish_reason) for i in range(8) for c in got[i]] == [
        ([5, 6], "length")
    ] * 8
    stats = cell.cell_statistics()
    assert (stats.generate_posts, stats.generate_requests) == (1, 8)


async def test_a_refused_request_fails_alone_and_before_any_delta(engine) -> None:
    """Requests posted in one batch: the one that fails validation gets its own typed error (the
    first frame of its tag, before any delta) and the others run."""
    await engine._open_stream()
    results: dict[str, object] = {}

    async def one(request: GenerateRequest) -> None:
        deltas = []
        try:
            async for d in engine.generate(request):
                deltas.append(d)
        except InvalidRequestError as exc:
            results[request.request_id] = (deltas, str(exc))
        else:
            results[request.request_id] = [d.token_ids for d in deltas if d.token_ids]

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, req("good-a", max_tokens=3))
        tg.start_soon(one, req("bad", prompt=[5, 2000]))
        tg.start_soon(one, req("good-b", max_tokens=3))
    deltas, message = results["bad"]
    assert deltas == [] and "2000" in message
    ref = ScriptedEngine(max_model_len=64)
    for rid in ("good-a", "good-b"):
        [c] = await collect(ref, req(rid, max_tokens=3))
        assert sum(results[rid], []) == c.token_ids


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_request_past_its_deadline_times_out_and_is_aborted(stepped_cell) -> None:
    """A request whose engine stops stepping ends with `EngineTimeoutError` at
    `request_timeout_s` (the client's deadline task wakes it), and the cell is told to abort it;
    a request after it still runs."""
    from gyre.errors import EngineTimeoutError

    engine, cell, url = stepped_cell
    config = EngineConfig(backend="scripted", max_model_len=64, request_timeout_s=0.5)
    async with CellClient(url, config) as client:
        start = time.monotonic()
        with pytest.raises(EngineTimeoutError, match="request_timeout_s=0.5"):
            await collect(client, req("stuck", max_tokens=3))
        assert time.monotonic() - start >= 0.5  # not before its deadline
        assert engine.aborted == ["stuck"]
        async with anyio.create_task_group() as tg:

            async def after() -> None:
                [c] = await collect(client, req("after", max_tokens=1))
                assert c.token_ids == [5]

            tg.start_soon(after)
            await wait_for(lambda: engine.waiting == 2)  # "stuck" too: it ends as abort now
            engine.advance()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_request_reusing_a_running_ones_id_leaves_it_counted(stepped_cell) -> None:
    """A second request with the ID of a running one ends first: the running one stays in the
    cell's in-flight IDs (a switch to train still aborts it) and ends with all its tokens."""
    engine, cell, url = stepped_cell
    got: dict[str, object] = {}
    async with CellClient(url, CONFIG) as client, anyio.create_task_group() as tg:

        async def first() -> None:
            got["first"] = await collect(client, req("same", max_tokens=1))

        tg.start_soon(first)
        await wait_for(lambda: engine.waiting == 1)
        [again] = await collect(client, req("same", max_tokens=0))
        assert again.finish_reason == "length" and cell._inflight == {"same": 1}
        engine.advance()
    [c] = got["first"]
    assert (c.token_ids, c.finish_reason) == ([5], "length") and not cell._inflight
