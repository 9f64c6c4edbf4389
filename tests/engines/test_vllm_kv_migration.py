"""KV-cache migration between two real vLLM cells (tiny model, ExampleConnector on a shared folder).

A request streams through the router on cell A; after a few tokens A leaves rollout, the router
aborts the request there, A exports the KV of prompt + tokens so far, and cell B continues from it
by loading, not prefilling. Greedy: the completion must equal an uninterrupted run on A token for
token (logprobs within 1e-5, fp32), at ~1K, 8K and 16K tokens of context. A source that dies falls
back to recompute, still exact. Every export is deleted after its import or by the lease; ordinary
requests store nothing. Two cells for the whole module (each start costs 30-60 s on 2 cores); the
test that kills cell A runs last. The death is before the export (killing A inside the ~10 ms export
is not reproducible); a half-written export is never loaded (`complete` marker) and expires.
The elastic runtime itself, with its default KV settings, migrates a call off a cell its policy
switches to training (the same two cells, behind ledger-trainer doubles).

The router's side of migration (when it migrates, when it falls back) is also checked in the fast
tier, on scripted engines with a scripted export (`ExportingEngine`).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import anyio
import msgspec
import pytest

from gyre.config import KVTransferConfig, RouterConfig, config_from_dict
from gyre.engines import GenerateRequest, SamplingParams, collect
from gyre.engines.protocol import KVExport, KVTransferEngine
from gyre.engines.scripted import ScriptedEngine
from gyre.errors import EngineUnavailableError, InvalidRequestError
from gyre.routing.continuation import MigrateContinuation
from gyre.routing.router import Router
from gyre.runtime.cell_handle import CellHandle
from gyre.runtime.elastic import ElasticRuntime
from gyre.runtime.elastic_job import continuation_for
from gyre.runtime.scheduler import Dispatch, StartStep, SwitchToTrain
from gyre.tasks.task import load_suite
from tests.conftest import start_vllm_cell
from tests.routing.test_router import prefix_rule
from tests.runtime.fake_cells import Exchange, FakeTrainingCell
from tests.runtime.test_suspension import failed

pytestmark = pytest.mark.anyio

FP32_TOL = 1e-5
BLOCK = 32
MAX_MODEL_LEN = 18_432  # 16K of context + completion
SWITCH_AFTER = 5  # tokens the caller has seen on A before A leaves rollout
KEEP = 48  # tokens the caller reads from B before aborting the request
TRIES = 3  # a contended machine may starve the test so long that A finishes before the switch
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"  # the node's backend


@pytest.fixture(scope="module")
def shared_dir():
    path = Path(f"/dev/shm/gyre-kv-test-{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cells(tiny_model_dir, tmp_path_factory, shared_dir):
    """Two cells (A, B) sharing one KV folder; yields ((process, cell) of A, (process, cell) of
    B)."""
    logs = tmp_path_factory.mktemp("kv-cells")
    kv = KVTransferConfig(connector="example", shared_dir=str(shared_dir))
    started = []
    try:
        for name in ("a", "b"):
            started.append(
                start_vllm_cell(
                    tiny_model_dir,
                    logs / f"cell-{name}.log",
                    max_model_len=MAX_MODEL_LEN,
                    kv_transfer=kv,
                )
            )
        yield started[0], started[1]
    finally:
        for process, _ in started:
            process.stop()


async def client(cell):
    from gyre.cell.client import CellClient

    return CellClient(cell.url, cell.config)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def greedy(rid: str, prompt: list[int], max_tokens: int | None = None) -> GenerateRequest:
    """Greedy; by default as long as the context allows, so that the switch never races the end
    (the request is aborted once it has continued, and the reference is cut to the same length)."""
    max_tokens = max_tokens or MAX_MODEL_LEN - len(prompt) - 8
    return GenerateRequest(
        request_id=rid,
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )


class WatchedMigrate(MigrateContinuation):
    """`MigrateContinuation` that notes the context length of each continuation it plans (a
    migration is recorded only once its attempt ended, too late for `switch_midway`)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.planned: list[int] = []

    async def prepare(self, request: GenerateRequest, **kwargs):
        self.planned.append(len(request.prompt_ids))
        return await super().prepare(request, **kwargs)


async def switch_midway(
    router: Router,
    request: GenerateRequest,
    after,
    migrate: WatchedMigrate,
    *,
    k: int = SWITCH_AFTER,
    keep: int | None = KEEP,
):
    """Stream `request` through `router`; once k tokens arrived, `moved = await after()`; once the
    caller has `keep` tokens of the continuation, abort the request (None: run it to its end).
    Returns (ids, lps, moved); the uninterrupted reference is a greedy run of len(ids) tokens."""
    ids: list[int] = []
    lps: list[float] = []
    moved = None
    aborted = False
    async for delta in router.generate(request):
        ids += delta.token_ids
        lps += delta.logprobs
        if moved is None and len(ids) >= k:
            moved = await after()
        elif moved and keep is not None and not aborted and migrate.planned:
            carried = migrate.planned[-1] - len(request.prompt_ids)
            if len(ids) >= carried + keep:
                aborted = True
                await router.abort(request.request_id)
    assert moved is not None
    return ids, lps, moved


def kill(process) -> None:
    """SIGKILL a cell process and then the engine processes it started (by PID): a sudden death.

    Raises `AssertionError` with the process's kernel state (each thread's state and wait channel)
    when it is not reaped 120 s after SIGKILL: one fresh-clone run at 5935402 timed out at 30 s
    and passed alone, so a recurrence says where the exit was stuck."""
    import psutil

    pid = process.process.pid
    children = psutil.Process(pid).children(recursive=True)
    process.process.kill()
    try:
        process.process.wait(120)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"cell {pid} not reaped 120 s after SIGKILL: {kernel_state(pid)}"
        ) from None
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=30)


def kernel_state(pid: int) -> str:
    """Each thread of `pid` as `tid:state:wchan` from /proc (what a stuck exit waits on)."""
    threads = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read() or "-"
        except OSError as exc:
            state, wchan = "?", type(exc).__name__
        threads.append(f"{tid}:{state}:{wchan}")
    return " ".join(threads) or "no threads"


def shared_entries(shared_dir: Path) -> list[str]:
    return sorted(os.listdir(shared_dir)) if shared_dir.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("context", [1_000, 8_000, 16_000])
async def test_migrated_request_equals_uninterrupted_run(cells, shared_dir, context: int) -> None:
    (_, cell_a), (_, cell_b) = cells
    prompt = tokens(context, seed=context)
    async with await client(cell_a) as a, await client(cell_b) as b:
        for attempt in range(TRIES):
            before = await b.refresh_statistics()
            migrate = WatchedMigrate()
            async with Router(
                {"a": a, "b": b}, roles={"b": "train"}, continuation=migrate
            ) as router:

                async def leave_a() -> int:
                    await router.set_role("b", "rollout")
                    return await router.set_role("a", "train")

                ids, lps, moved = await switch_midway(
                    router, greedy(f"mig-{context}-{attempt}", prompt), leave_a, migrate
                )
                stats = router.statistics()
            if moved:
                break
        else:
            pytest.fail(
                f"the request ended on A before the switch in {TRIES} tries "
                "(machine too contended?)"
            )
        after = await b.refresh_statistics()
        [reference] = await collect(
            a, greedy(f"ref-{context}", prompt, len(ids))
        )  # on A: B's cache stays cold

    assert ids == reference.token_ids
    assert max(abs(x - y) for x, y in zip(lps, reference.logprobs, strict=True)) <= FP32_TOL
    [record] = migrate.statistics().records
    assert record.outcome == "migrated", record.reason
    k = record.sequence_tokens - context
    assert SWITCH_AFTER <= k < len(ids)
    assert record.tokens_moved == (context + k - 1) // BLOCK * BLOCK
    assert stats.requests_migrated == 1 and stats.tokens_migrated == record.tokens_moved
    # B loaded the context instead of prefilling it: at most one block recomputed
    loaded = after.kv_tokens_loaded - before.kv_tokens_loaded
    assert loaded >= context + k - BLOCK
    assert loaded == record.tokens_moved
    assert after.prompt_tokens_computed - before.prompt_tokens_computed == context + k - loaded
    assert shared_entries(shared_dir) == []  # released after the import


@pytest.mark.slow
async def test_ordinary_requests_store_nothing_and_exports_expire(cells, shared_dir) -> None:
    from gyre.engines.kv_folder import sweep

    (_, cell_a), _ = cells
    prompt = tokens(600, seed=1)
    async with await client(cell_a) as a:
        [done] = await collect(a, greedy("plain", prompt, max_tokens=8))
        assert shared_entries(shared_dir) == []  # the connector stores only export requests
        before = await a.refresh_statistics()
        export = await a.export_kv(prompt + done.token_ids)
        again = await a.export_kv(prompt + done.token_ids)  # already there: refreshes the lease
        after = await a.refresh_statistics()
        with pytest.raises(InvalidRequestError):
            await a.export_kv(prompt[:BLOCK])
    assert export.key == again.key and export.tokens == (608 - 1) // BLOCK * BLOCK
    assert export.sequence_tokens == 608 and export.weight_version == 0
    per_token = 2 * 2 * 2 * 32 * 4  # layers * kv heads * (K, V) * head_dim * fp32 bytes
    assert export.bytes >= export.tokens * per_token
    assert after.kv_exports - before.kv_exports == 2
    assert shared_entries(shared_dir) == [export.key]
    lease_s = cell_a.config.kv_transfer.lease_s
    assert sweep(shared_dir, lease_s) == 0  # within its lease
    assert sweep(shared_dir, lease_s, now=time.time() + lease_s + 1) == 1
    assert shared_entries(shared_dir) == []


@pytest.mark.slow
async def test_repeated_switches_migrate_every_time(cells, shared_dir) -> None:
    """One long request forced to switch cells up to 50 times, then aborted: one call, nothing lost,
    exact, store empty. A switch takes a few hundred ms while the other cell keeps generating, so
    on a contended machine fewer than 50 fit before `stop_at` tokens (at least 5 must)."""
    (_, cell_a), (_, cell_b) = cells
    prompt = tokens(1_000, seed=3)
    max_tokens, every, switches, stop_at = 17_000, 8, 50, 16_000
    async with await client(cell_a) as a, await client(cell_b) as b:
        migrate = MigrateContinuation()
        moved = 0
        async with Router({"a": a, "b": b}, roles={"b": "train"}, continuation=migrate) as router:
            ids: list[int] = []
            lps: list[float] = []
            active, idle = "a", "b"
            next_switch = every
            aborted = False
            async for delta in router.generate(greedy("pingpong", prompt, max_tokens)):
                ids += delta.token_ids
                lps += delta.logprobs
                if aborted:
                    continue
                if moved >= switches or len(ids) >= stop_at:
                    aborted = True
                    await router.abort("pingpong")
                elif len(ids) >= next_switch:
                    await router.set_role(idle, "rollout")
                    moved += await router.set_role(active, "train")
                    active, idle = idle, active
                    next_switch = len(ids) + every
            stats = router.statistics()
        [reference] = await collect(a, greedy("ref-pingpong", prompt, len(ids)))

    assert ids == reference.token_ids
    assert max(abs(x - y) for x, y in zip(lps, reference.logprobs, strict=True)) <= FP32_TOL
    m = migrate.statistics()
    assert 5 <= moved <= switches
    # every forced switch moved the request with its KV, except that the last one may land after
    # the request's final token (nothing left to move; seen once in CI: 49 of 50)
    assert moved - 1 <= m.migrated <= moved
    assert (m.recomputed, m.exports_failed, m.release_failed) == (0, 0, 0)
    assert all(r.outcome == "migrated" for r in m.records)
    assert stats.requests_total == 1
    assert stats.requests_migrated == stats.requests_redirected == m.released == m.migrated
    # an abort that races the last switch can leave that switch's export to the lease sweep (seen
    # in a clone run: one entry); the sweep the node runs then removes it
    assert len(shared_entries(shared_dir)) <= 1
    from gyre.engines.kv_folder import sweep

    lease_s = cell_a.config.kv_transfer.lease_s
    sweep(shared_dir, lease_s, now=time.time() + lease_s + 1)
    assert shared_entries(shared_dir) == []


class RealEngineCell(FakeTrainingCell):
    """A cell double whose engine is a real vLLM cell (KV export and import through it) and whose
    trainer is the ledger double; a published version is the model's own weights, reloaded."""

    def __init__(self, index: int, engine, exchange: Exchange, model_dir: Path) -> None:
        super().__init__(index, engine, exchange)
        self.model_dir = str(model_dir)

    async def export_kv(self, token_ids: list[int]) -> KVExport:
        return await self.engine.export_kv(token_ids)

    async def release_kv(self, key: str) -> bool:
        return await self.engine.release_kv(key)

    async def load_weights(self, snapshot: str, version: int) -> None:
        await self.engine.load_weights(self.model_dir, version)


class SwitchAtFirstFinish:
    """Both cells roll out one group (a long call and a short execution); when the short one
    finishes, the cell still running the long call switches to train (the runtime moves the
    execution off it, the router redirects its call); the step starts once the group is trained."""

    name = "switch-at-first-finish"

    def __init__(self) -> None:
        self.switched: int | None = None

    def initial_roles(self, num_cells: int, core_cell: int) -> tuple[str, ...]:
        return ("rollout",) * num_cells

    def decide(self, state):  # noqa: ANN001, ANN201 - test double
        if state.dispatched < state.batch_executions:
            return (Dispatch(state.batch_executions - state.dispatched),)
        if state.finished and self.switched is None:
            busy = [c.index for c in state.cells if c.executions] or [1]  # [1]: nothing to move
            self.switched = busy[0]
            return (SwitchToTrain(busy[0]),)
        if state.trained == state.batch_executions and not state.step_running:
            return () if state.steps_done else (StartStep(),)
        return ()


class LongAndShortRollout:
    """Execution x0 streams one greedy call of `max_tokens` through the router; x1 ends (failed:
    nothing to train) once x0 has `k` tokens, so its end, and with it the switch, falls inside
    x0's call."""

    def __init__(self, router: Router, prompt: list[int], max_tokens: int, k: int) -> None:
        self.router, self.prompt, self.max_tokens, self.k = router, prompt, max_tokens, k
        self.streaming = anyio.Event()
        self.ids: list[int] = []
        self.lps: list[float] = []

    async def run(self, task, execution_id: str):  # noqa: ANN001, ANN201 - test double
        if execution_id.startswith("x0-"):
            request = greedy(f"{execution_id}/c0", self.prompt, self.max_tokens)
            async for delta in self.router.engine_for(execution_id).generate(request):
                self.ids += delta.token_ids
                self.lps += delta.logprobs
                if len(self.ids) >= self.k:
                    self.streaming.set()
        else:
            await self.streaming.wait()
        return failed(task, execution_id)


@pytest.mark.slow
async def test_the_runtime_migrates_a_call_off_a_switching_cell(
    cells, shared_dir, tmp_path: Path
) -> None:
    """The elastic runtime with its default KV settings (`continuation_for`: the example connector,
    on by default) over the two real cells: the policy switches the cell running a long greedy call
    to train mid-call; the runtime moves the execution, the router redirects the call, and the
    other cell continues it from the imported KV, token for token as an uninterrupted run."""
    (_, cell_a), (_, cell_b) = cells
    config = config_from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "loop": {"steps": 1, "batch_executions": 2, "group_size": 2, "heldout_tasks": 0},
            "scheduler": {"capacity_per_cell": 2},
            "tasks": {"suites": [str(REPO / "examples/tasks/learnable")]},
        }
    )
    assert config.engine.kv_transfer.connector == "example"  # the default
    prompt = tokens(1_000, seed=11)
    max_tokens = 1_500
    async with await client(cell_a) as a, await client(cell_b) as b:
        engines = [a, b]
        for attempt in range(TRIES):
            before = [await e.refresh_statistics() for e in engines]
            exchange = Exchange()
            doubles = [
                RealEngineCell(i, e, exchange, cell_a.model_dir) for i, e in enumerate(engines)
            ]
            handles = [CellHandle(name=f"cell-{i}", client=d) for i, d in enumerate(doubles)]
            continuation = continuation_for(config)
            assert isinstance(continuation, MigrateContinuation)
            policy = SwitchAtFirstFinish()
            async with Router(
                {h.name: h.client for h in handles}, config=config.router, continuation=continuation
            ) as router:
                rollout = LongAndShortRollout(router, prompt, max_tokens, k=SWITCH_AFTER)
                runtime = ElasticRuntime(
                    config=config,
                    cells=handles,
                    router=router,
                    rollout=rollout,
                    policy=policy,
                    tasks=load_suite(REPO / "examples/tasks/learnable"),
                    snapshot=str(cell_a.model_dir),
                    launch=f"m{attempt}",
                )
                with anyio.fail_after(300):
                    await runtime.run(1)
            source, target = policy.switched, 1 - policy.switched
            await engines[source].resume()  # the double paused it for training
            after = [await e.refresh_statistics() for e in engines]
            stats = runtime.statistics()
            if stats.redirections:
                break
        else:
            pytest.fail(f"the long call ended before the switch in {TRIES} tries (contended?)")
        for e in engines:  # back to version 0 for the tests that follow
            await e.load_weights(str(cell_a.model_dir), 0)
        [reference] = await collect(engines[source], greedy("ref-runtime", prompt, max_tokens))

    assert rollout.ids == reference.token_ids
    assert max(abs(x - y) for x, y in zip(rollout.lps, reference.logprobs, strict=True)) <= FP32_TOL
    [record] = continuation.statistics().records
    assert record.outcome == "migrated", record.reason
    k = record.sequence_tokens - len(prompt)
    assert SWITCH_AFTER <= k < max_tokens
    assert record.tokens_moved == (len(prompt) + k - 1) // BLOCK * BLOCK
    # the runtime's own record counts the migration, and the step ran after it
    assert (stats.redirections, stats.migrations) == (1, 1)
    assert stats.tokens_migrated == record.tokens_moved
    assert (stats.switches, stats.steps_done, stats.weight_version) == (1, 1, 1)
    # the target loaded the exported context instead of prefilling it, the source exported it
    loaded = after[target].kv_tokens_loaded - before[target].kv_tokens_loaded
    assert loaded == record.tokens_moved
    assert after[source].kv_exports - before[source].kv_exports == 1
    assert shared_entries(shared_dir) == []  # released after the import


@pytest.mark.slow
async def test_source_that_dies_falls_back_to_recompute(cells, shared_dir) -> None:
    """Runs last: it stops cell A."""
    (process_a, cell_a), (_, cell_b) = cells
    prompt = tokens(2_000, seed=7)
    async with await client(cell_a) as a, await client(cell_b) as b:
        before = await b.refresh_statistics()
        migrate = WatchedMigrate()
        config = RouterConfig(abort_timeout_s=20.0, max_retries=0)
        async with Router(
            {"a": a, "b": b}, roles={"b": "train"}, continuation=migrate, config=config
        ) as router:

            async def kill_a() -> int:
                await router.set_role("b", "rollout")
                await anyio.to_thread.run_sync(kill, process_a)
                return 1

            ids, lps, _ = await switch_midway(router, greedy("dies", prompt), kill_a, migrate)
            stats = router.statistics()
        after = await b.refresh_statistics()
        [reference] = await collect(b, greedy("ref-dies", prompt, len(ids)))  # A is gone

    assert ids == reference.token_ids
    assert max(abs(x - y) for x, y in zip(lps, reference.logprobs, strict=True)) <= FP32_TOL
    m = migrate.statistics()
    assert (m.migrated, m.recomputed, m.exports_failed) == (0, 1, 1)
    assert m.records[-1].outcome == "recomputed" and "export failed" in m.records[-1].reason
    assert stats.requests_migrated == 0 and stats.requests_redirected == 1
    assert [c.name for c in stats.cells if c.down is not None] == ["a"]
    assert after.kv_tokens_loaded == before.kv_tokens_loaded
    assert shared_entries(shared_dir) == []


# -- the router's side, on scripted engines (fast tier) -------------------------------------------


class ExportingEngine(ScriptedEngine):
    """A scripted engine with a scripted KV export: `export` says what `export_kv` does
    ("ok", "fail" or "hang"); released keys are recorded. A request carrying an export reports
    its tokens cached on its final delta when `loads` (as vLLM does once the connector loaded
    them), and only its own prefix-cache hits (none) when not: a target whose KV folder is not
    the source's prefills quietly."""

    def __init__(self, *, export: str = "ok", weight_version: int = 0, loads: bool = True) -> None:
        super().__init__(
            rule=prefix_rule, vocab_size=64, token_delay_s=0.002, weight_version=weight_version
        )
        self.export = export
        self.loads = loads
        self.exported: list[list[int]] = []
        self.released: list[str] = []

    async def export_kv(self, token_ids: list[int]) -> KVExport:
        if self.export == "fail":
            raise EngineUnavailableError("scripted: the source is gone")
        if self.export == "hang":
            await anyio.sleep_forever()
        self.exported.append(list(token_ids))
        n = (len(token_ids) - 1) // BLOCK * BLOCK
        return KVExport(
            key=f"{len(self.exported):032x}",
            tokens=n,
            sequence_tokens=len(token_ids),
            bytes=n * 1024,
            weight_version=self.statistics().weight_version,
            seconds=0.0,
        )

    async def release_kv(self, key: str) -> bool:
        self.released.append(key)
        return True

    async def generate(self, request: GenerateRequest):
        cached = request.kv_import.tokens if request.kv_import and self.loads else 0
        async for delta in super().generate(request):
            if delta.finish_reason is not None:
                delta = msgspec.structs.replace(delta, cached_tokens=cached)
            yield delta


async def _switch_once(a, b, migrate: WatchedMigrate, prompt: list[int]):
    async with Router({"a": a, "b": b}, roles={"b": "train"}, continuation=migrate) as router:

        async def leave_a() -> int:
            await router.set_role("b", "rollout")
            moved = await router.set_role("a", "train")
            assert moved == 1
            return moved

        ids, lps, _ = await switch_midway(
            router, greedy("r", prompt, 40), leave_a, migrate, keep=None
        )
        return ids, lps, router.statistics()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_router_migrates_with_an_export_and_releases_it() -> None:
    prompt = list(range(3, 63)) * 2
    [ref] = await collect(
        ScriptedEngine(rule=prefix_rule, vocab_size=64), greedy("ref", prompt, 40)
    )
    a, b = ExportingEngine(), ExportingEngine()
    assert isinstance(a, KVTransferEngine)
    migrate = WatchedMigrate()
    ids, lps, stats = await _switch_once(a, b, migrate, prompt)
    assert (ids, lps) == (ref.token_ids, ref.logprobs)
    [seq] = a.exported
    assert seq == prompt + ids[: len(seq) - len(prompt)]
    [record] = migrate.statistics().records
    assert (record.outcome, record.sequence_tokens, record.tokens_moved) == (
        "migrated",
        len(seq),
        (len(seq) - 1) // 32 * 32,
    )
    assert stats.requests_migrated == 1 and stats.tokens_migrated == record.tokens_moved
    assert stats.tokens_recomputed == len(seq) - record.tokens_moved
    assert stats.migrations_missed == 0 and migrate.statistics().imports_missed == 0
    assert b.released == ["1".zfill(32)] and migrate.statistics().released == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_target_that_did_not_load_the_export_is_no_migration() -> None:
    """Issue 21: across hosts a target whose KV folder is not the source's is handed the export,
    finds nothing and prefills quietly. Its final delta reports no cached tokens, so the
    continuation counts as a missed import, recomputed, not as a migration."""
    prompt = list(range(3, 63)) * 2
    [ref] = await collect(
        ScriptedEngine(rule=prefix_rule, vocab_size=64), greedy("ref", prompt, 40)
    )
    a, b = ExportingEngine(), ExportingEngine(loads=False)
    migrate = WatchedMigrate()
    ids, lps, stats = await _switch_once(a, b, migrate, prompt)
    assert (ids, lps) == (ref.token_ids, ref.logprobs)
    [seq] = a.exported
    [continued] = b.requests_seen
    assert (
        continued.kv_import is not None and continued.kv_import.tokens == (len(seq) - 1) // 32 * 32
    )
    m = migrate.statistics()
    [record] = m.records
    assert (record.outcome, record.tokens_moved) == ("recomputed", 0)
    assert f"0 prompt tokens cached, the export holds {continued.kv_import.tokens}" in record.reason
    assert (m.migrated, m.recomputed, m.imports_missed, m.tokens_moved) == (0, 1, 1, 0)
    assert (stats.requests_redirected, stats.requests_migrated, stats.migrations_missed) == (
        1,
        0,
        1,
    )
    assert stats.tokens_migrated == 0 and stats.tokens_recomputed == len(seq)
    assert b.released == ["1".zfill(32)] and m.released == 1  # the unused export is deleted


@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        (dict(export="fail"), dict(), "export failed: EngineUnavailableError"),
        (dict(export="hang"), dict(), "export timed out"),
        (dict(), dict(weight_version=1), "weight version 0, target at 1"),
    ],
)
async def test_router_falls_back_to_recompute_when_migration_cannot_work(
    source, target, reason
) -> None:
    prompt = list(range(3, 63)) * 2
    [ref] = await collect(
        ScriptedEngine(rule=prefix_rule, vocab_size=64), greedy("ref", prompt, 40)
    )
    a, b = ExportingEngine(**source), ExportingEngine(**target)
    migrate = WatchedMigrate(export_timeout_s=0.2)
    ids, lps, stats = await _switch_once(a, b, migrate, prompt)
    assert (ids, lps) == (ref.token_ids, ref.logprobs)
    [record] = migrate.statistics().records
    assert record.outcome == "recomputed" and reason in record.reason, record.reason
    assert stats.requests_migrated == 0 and stats.requests_redirected == 1
    assert stats.tokens_recomputed == record.sequence_tokens
    # an export that was made but cannot be used is released at once
    assert b.released == ([] if source else ["1".zfill(32)])


def test_an_export_deleted_before_its_load_is_recomputed_not_fatal(tmp_path: Path) -> None:
    """The scheduler saw a complete export, then it was released (an earlier attempt with the same
    key ended) before the worker loaded it: seen in CI as a FileNotFoundError that killed vLLM's
    engine core. The connector reports the request's blocks failed and vLLM recomputes them."""
    from types import SimpleNamespace

    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
        ExampleConnectorMetadata,
    )

    from gyre.engines.kv_connector import GyreKVConnector

    connector = GyreKVConnector.__new__(GyreKVConnector)  # the worker side, without a vLLM config
    connector._failed_blocks, connector._block_size, connector._storage_path = (
        set(),
        16,
        str(tmp_path),
    )
    meta = ExampleConnectorMetadata()
    # 33 tokens: the first 32 are loaded (the last is always computed): slots 48-63 and 112-127
    meta.add_request(list(range(33)), [3, 7], 16, is_store=False, mm_hashes=[])
    connector._get_connector_metadata = lambda: meta
    layer = "model.layers.0.self_attn.attn"
    context = SimpleNamespace(
        attn_metadata={layer: None},
        no_compile_layers={layer: SimpleNamespace(kv_cache=torch.zeros(1))},
    )
    connector.start_load_kv(context)  # no file under tmp_path: the export is gone
    assert connector.get_block_ids_with_load_errors() == {3, 7}
    assert connector.get_block_ids_with_load_errors() == set()  # reported once
