"""KV migration through vLLM's NixlConnector between two real vLLM cells (tiny model, CPU: UCX).

The same switch as `test_vllm_kv_migration.py`, but cell B pulls the KV straight from cell A's
memory (no shared folder): greedy continuation equal to an uninterrupted run on A token for token
(logprobs within 1e-5), and B's counters show the context was pulled, not prefilled. Skipped
unless the `nixl` package is importable (NIXL wheels, `docs/notes/vllm-cpu.md`).
"""

from __future__ import annotations

import importlib.util

import pytest

from gyre.config import KVTransferConfig
from gyre.engines import collect
from gyre.routing.continuation import MigrateContinuation
from gyre.routing.router import Router
from tests.conftest import start_vllm_cell
from tests.engines.test_vllm_kv_migration import (
    BLOCK,
    FP32_TOL,
    SWITCH_AFTER,
    TRIES,
    client,
    greedy,
    switch_midway,
    tokens,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture(scope="module")
def nixl_cells(tiny_model_dir, tmp_path_factory):
    if importlib.util.find_spec("nixl") is None:
        pytest.skip("the nixl package is not installed (pip install nixl==1.5.1 nixl-cu12==1.5.1)")
    logs = tmp_path_factory.mktemp("nixl-cells")
    kv = KVTransferConfig(connector="nixl", lease_s=60.0)
    started = []
    try:
        for name in ("a", "b"):
            started.append(
                start_vllm_cell(
                    tiny_model_dir, logs / f"cell-{name}.log", max_model_len=10_240, kv_transfer=kv
                )
            )
        yield started[0][1], started[1][1]
    finally:
        for process, _ in started:
            process.stop()


async def test_nixl_migrated_request_equals_uninterrupted_run(nixl_cells) -> None:
    cell_a, cell_b = nixl_cells
    context = 8_000
    prompt = tokens(context, seed=context)
    async with await client(cell_a) as a, await client(cell_b) as b:
        for attempt in range(TRIES):
            before = await b.refresh_statistics()
            migrate = MigrateContinuation()
            async with Router(
                {"a": a, "b": b}, roles={"b": "train"}, continuation=migrate
            ) as router:

                async def leave_a() -> int:
                    await router.set_role("b", "rollout")
                    return await router.set_role("a", "train")

                ids, lps, moved = await switch_midway(
                    router, greedy(f"mig-{attempt}", prompt, 2_000), leave_a, migrate
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
        [reference] = await collect(a, greedy("ref", prompt, len(ids)))

    assert ids == reference.token_ids
    assert max(abs(x - y) for x, y in zip(lps, reference.logprobs, strict=True)) <= FP32_TOL
    [record] = migrate.statistics().records
    assert record.outcome == "migrated", record.reason
    k = record.sequence_tokens - context
    assert SWITCH_AFTER <= k < len(ids)
    assert stats.requests_migrated == 1
    loaded = after.kv_tokens_loaded - before.kv_tokens_loaded
    assert loaded >= context + k - BLOCK
    assert after.prompt_tokens_computed - before.prompt_tokens_computed == context + k - loaded
