"""The node's view of a cell: `CellClient` (the `InferenceEngine` protocol over HTTP).

Owns `CellClient` and `WatchedProcess` (a cell's process as the node watches it for death: a
local `subprocess.Popen` or a worker host's `gyre.cell.join.RemoteCellProcess`); starting cells is
`gyre.cell.spawn`'s (`open_cell`, `open_cells`). On anyio + httpx: the node's trio loop and
asyncio alike; code above it cannot tell a cell from the scripted engine.
Besides the `InferenceEngine` protocol it drives the cell's role and trainer (`switch_role`,
`train`, `send_gradients`, `receive_gradients`, `step`, ...). Every wait is bounded (docs/design.md
invariant 7): requests by `request_timeout_s`, weight loads by `weight_load_timeout_s`, training
calls and switches by `TrainerConfig.train_timeout_s`, start-up by `startup_timeout_s`.
Knows nothing about what the cell runs inside (vLLM, DeepSpeed).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Protocol

import anyio
import httpx
import msgspec

from gyre.cell.inbox import DeltaInbox, Outbox, expire_inboxes
from gyre.cell.wire import (
    AbortRequest,
    CellStatistics,
    CheckpointRequest,
    ExportKVRequest,
    Frame,
    FrameBatch,
    FrameReader,
    LoadWeightsRequest,
    ReceiveGradientsRequest,
    ReleaseKVRequest,
    SendGradientsRequest,
    StepRequest,
    StepResult,
    StreamedGenerate,
    SwitchRequest,
    SwitchResult,
    TrainRequest,
    WireError,
    auth_headers,
    decode,
    encode,
)
from gyre.config import EngineConfig, TrainerConfig
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
from gyre.trajectory.pack import PackedBatch

__all__ = ["CellClient", "StepResult", "WatchedProcess"]

_HEADERS = {"Content-Type": "application/msgpack"}
_TRAIN_TIMEOUT_MARGIN_S = 10.0
"""Seconds the client waits for a training call beyond the cell's own `train_timeout_s`."""


def _raise_for(response: httpx.Response, body: bytes) -> None:
    if response.status_code == 200:
        return
    try:
        err = decode(body, WireError)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise EngineError(f"cell answered HTTP {response.status_code}: {body[:200]!r}") from None
    raise error_from_code(err.code, err.message)


class WatchedProcess(Protocol):
    """A cell's process as the node watches it for death: a local one (`subprocess.Popen`, of
    `gyre.cell.spawn.CellProcess`) or a worker host's (`gyre.cell.join.RemoteCellProcess`)."""

    def poll(self) -> int | None:
        """None while it runs, else its exit code."""
        ...


class CellClient:
    """`InferenceEngine` over a cell's token-level API (see `gyre.cell.api`).

    Use as `async with CellClient(url, config) as engine:`. `statistics()` returns the snapshot
    fetched by the last `refresh_statistics()` (HTTP cannot be called synchronously).

    Requests share one delta stream (`GET /stream`, opened on the first `generate` and read by a
    task of the client's own task group): each `generate` posts its request, then receives its
    frames from the stream. A consumer that leaves early (cancelled, or closing the iterator)
    aborts its request in the cell; a lost stream fails every request on it.
    """

    def __init__(
        self,
        base_url: str,
        config: EngineConfig = EngineConfig(),
        trainer_config: TrainerConfig | None = None,
    ) -> None:
        self.base_url = base_url
        self.config = config
        self.trainer_config = trainer_config or TrainerConfig()
        self.rank: int | None = None
        """The cell's rank in the run-wide gradient group (set by `open_cells`)."""
        self.process: WatchedProcess | None = None
        """The cell's process when this node started it (set by `open_cells`); None otherwise."""
        self._http: httpx.AsyncClient | None = None
        self._stats: EngineStatistics | None = None
        self._tasks: anyio.abc.TaskGroup | None = None  # holds the delta stream's reader
        self._stream_id: str | None = None  # the open delta stream
        self._stream_lock: anyio.Lock | None = None
        self._inboxes: dict[int, DeltaInbox] = {}  # by request tag
        self._outbox = Outbox()
        self._tags = itertools.count()

    async def __aenter__(self) -> CellClient:
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=auth_headers(),
            timeout=httpx.Timeout(self.config.request_timeout_s, connect=10.0),
            # no idle keep-alive connections: a burst of requests was assigned one idle
            # connection and the losers retried (185 retries for 32 requests)
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self._stream_lock = anyio.Lock()
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(self._post_requests)
        self._tasks.start_soon(expire_inboxes, self._inboxes, self.config.request_timeout_s)
        try:
            await self.refresh_statistics()
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        tasks, self._tasks = self._tasks, None
        try:
            if tasks is not None:
                tasks.cancel_scope.cancel()  # reader, poster, deadlines: none raises
                # not handed the body's exception: trio's nursery would wrap it in a group
                await tasks.__aexit__(None, None, None)
        finally:
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
                response = await self.http.post(
                    path, content=encode(body), headers=_HEADERS, timeout=timeout_s
                )
        except TimeoutError:
            raise EngineTimeoutError(
                f"cell {self.base_url} {path}: no answer within {timeout_s} s"
            ) from None
        except httpx.TransportError as exc:
            raise EngineUnavailableError(f"cell {self.base_url} {path}: {exc!r}") from None
        _raise_for(response, response.content)
        return response.content

    async def _post_requests(self) -> None:
        """Post the queued generate requests, every one queued at each wake-up in one
        `POST /generate`; a refused or failed post fails its requests (their consumers left
        already are not posted)."""
        while True:
            batch = [i for i in await self._outbox.wait_batch() if i[0].tag in self._inboxes]
            try:
                if batch:
                    body = [request for request, _ in batch]
                    await self._post("/generate", body, self.config.request_timeout_s)
            except GyreError as exc:
                error = WireError(code=exc.code, message=str(exc))
                for request, inbox in batch:
                    inbox.put(Frame(error=error, tag=request.tag))

    async def _open_stream(self) -> str:
        """The ID of the open delta stream; opens it (starts its reader) if there is none."""
        if self._stream_id is None:
            if self._tasks is None or self._stream_lock is None:
                raise EngineUnavailableError("CellClient used outside `async with`")
            async with self._stream_lock:
                if self._stream_id is None:
                    await self._tasks.start(self._read_stream)
        assert self._stream_id is not None
        return self._stream_id

    async def _read_stream(self, *, task_status: anyio.abc.TaskStatus) -> None:
        """Open `GET /stream` and hand each frame to its request's channel until the stream ends;
        then fail the requests left on it. Errors opening it go to the caller of `start`."""
        stream_id = uuid.uuid4().hex
        lost: GyreError = EngineUnavailableError(f"cell {self.base_url} ended the delta stream")
        started = False
        try:
            async with self.http.stream(
                "GET",
                "/stream",
                params={"id": stream_id},
                timeout=httpx.Timeout(None, connect=10.0),
            ) as response:
                if response.status_code != 200:
                    _raise_for(response, await response.aread())
                self._stream_id, started = stream_id, True
                task_status.started()
                reader = FrameReader(FrameBatch)
                async for chunk in response.aiter_bytes():
                    for batch in reader.feed(chunk):
                        for frame in batch.frames:
                            inbox = self._inboxes.get(frame.tag)
                            if inbox is not None:  # None: its consumer left
                                inbox.put(frame)
        except httpx.TransportError as exc:
            lost = EngineUnavailableError(f"cell {self.base_url} lost the delta stream: {exc!r}")
            if not started:
                raise lost from None
        finally:
            if self._stream_id == stream_id:
                self._stream_id = None
            for inbox in list(self._inboxes.values()):
                inbox.put(lost)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        # No cancel scope spans a `yield` (a consumer may resume this generator from another
        # task): each wait is bounded by the request's deadline (`expire_inboxes`). Each wake-up
        # takes every frame queued for the request and yields a choice's consecutive deltas as one.
        stream_id = await self._open_stream()
        tag = next(self._tags)
        inbox = self._inboxes[tag] = DeltaInbox(time.monotonic() + self.config.request_timeout_s)
        pending = set(range(request.sampling.n))
        ended = False  # nothing of the request is left in the cell: no abort needed
        try:
            self._outbox.put(StreamedGenerate(stream=stream_id, tag=tag, request=request), inbox)
            while pending:
                try:
                    deltas, failure = await inbox.wait_deltas(request.request_id)
                except TimeoutError:
                    ended = True
                    await self._abort_quietly(request.request_id)
                    raise EngineTimeoutError(
                        f"request {request.request_id!r} exceeded "
                        f"request_timeout_s={self.config.request_timeout_s}"
                    ) from None
                for delta in deltas:
                    if delta.finish_reason is not None:
                        pending.discard(delta.index)
                    yield delta
                if failure is not None and pending:
                    ended = True
                    raise failure
        finally:
            del self._inboxes[tag]
            if pending and not ended:  # the consumer left early: free the engine
                await self._abort_quietly(request.request_id)

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
            await self._post(
                "/load_weights",
                LoadWeightsRequest(snapshot, version),
                self.config.weight_load_timeout_s,
            )
        except EngineTimeoutError as exc:
            raise WeightSyncError(f"weight load of version {version}: {exc}") from None
        await self.refresh_statistics()

    async def export_kv(self, token_ids: list[int]) -> KVExport:
        """Have the cell store the KV of `token_ids` (see `KVTransferEngine`); bounded by
        `request_timeout_s`. Raises `EngineUnavailableError` (no connector, unreachable),
        `InvalidRequestError`, `EngineTimeoutError`."""
        body = await self._post(
            "/export_kv", ExportKVRequest(list(token_ids)), self.config.request_timeout_s
        )
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
            raise EngineTimeoutError(
                f"cell {self.base_url} {path}: no answer within {timeout_s} s"
            ) from None
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
        body = await self._post(
            "/switch",
            SwitchRequest(role=role, snapshot=snapshot, version=version),
            self._train_timeout_s,
        )
        return decode(body, SwitchResult).seconds

    async def train(
        self, micro_batches: Sequence[PackedBatch], advantages: Mapping[str, float | None]
    ) -> AccumulateStatistics:
        """Accumulate the gradients of `micro_batches` in the cell's trainer (role "train"; no
        step). Raises `InvalidRequestError` in another role, for no micro-batches or an execution
        without an advantage (nothing is accumulated then)."""
        request = TrainRequest(micro_batches=list(micro_batches), advantages=dict(advantages))
        return decode(
            await self._post("/train", request, self._train_timeout_s), AccumulateStatistics
        )

    async def load_trainer_weights(self, snapshot: str, version: int) -> None:
        """Load a weight snapshot into the cell's trainer (a satellite syncing to the core).
        Raises `InvalidRequestError` for a bad snapshot or while gradients are held."""
        await self._post(
            "/load_trainer_weights", LoadWeightsRequest(snapshot, version), self._train_timeout_s
        )

    async def send_gradients(self, dst: int) -> None:
        """Satellite: send the accumulated flat gradient to rank `dst` (the core, which must call
        `receive_gradients` concurrently), then zero it. A failed send keeps the gradients."""
        await self._post("/send_gradients", SendGradientsRequest(dst=dst), self._train_timeout_s)

    async def receive_gradients(self, src: int) -> None:
        """Core: receive rank `src`'s flat gradient and add it to the accumulation."""
        await self._post(
            "/receive_gradients", ReceiveGradientsRequest(src=src), self._train_timeout_s
        )

    async def step(self, snapshot_root: str) -> StepResult:
        """Core: one optimizer step on everything accumulated and received; when applied, the new
        weights are saved under `snapshot_root/v<version>` (`StepResult.snapshot`)."""
        return decode(
            await self._post(
                "/step", StepRequest(snapshot_root=str(snapshot_root)), self._train_timeout_s
            ),
            StepResult,
        )

    async def save_checkpoint(self, path: str) -> None:
        """Core: write a DeepSpeed checkpoint (weights, optimizer state, version) at `path`."""
        await self._post(
            "/save_checkpoint", CheckpointRequest(path=str(path)), self._train_timeout_s
        )

    async def load_checkpoint(self, path: str) -> None:
        """Core: restore a DeepSpeed checkpoint; `InvalidRequestError` when there is none."""
        await self._post(
            "/load_checkpoint", CheckpointRequest(path=str(path)), self._train_timeout_s
        )

    async def cell_statistics(self) -> CellStatistics:
        """The cell's role, trainer version and gradient traffic, fetched now."""
        return await self._get("/cell_statistics", CellStatistics)
