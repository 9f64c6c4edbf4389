"""Ultra-long executions end to end (issue 16): records, trees and training in memory linear in
tokens, and a 128K-token execution trained on this CPU.

Two parts, each measured on executions of the scripted long-horizon agent
(`gyre.agents.long_horizon`: file work, compactions, sub-agents) run by the harness through the
real TITO proxy:

- scripted engine, 700K tokens: peak traced memory (tracemalloc) of recording the execution (the
  proxy serving it and writing its call log) and of reading the log back, over its token arrays
  (the per-token arrays of its trajectory tree, as `bench_records`; and, stricter, its int32
  token IDs alone); `build_tree` seconds; selection and packing seconds.
- real engines, 32K and 128K tokens: the tiny model built with a 131072-token context
  (`ModelConfig.max_position_embeddings`) served by a vLLM cell at `max_model_len = 131072`;
  the execution goes proxy -> tree -> select (every path) -> pack -> one DeepSpeed step
  (advantage +1) -> snapshot -> `load_weights` into the cell, and a call after the sync is
  sampled at the new version. The trainer's RSS is sampled every 5 ms during the step; the
  128K / 32K ratio is of the step's RSS growth over the RSS before it (the absolute peaks also
  hold the model, DeepSpeed and this process's proxy). `train_time_ratio_vs_linear_128k`: the
  step's forward/backward over the tree against the same selected paths forwarded one by one.

    .venv/bin/python -m benchmarks.bench_long [--skip-real] [--skip-scripted]

Writes `benchmarks/results/long.json`; goals missed are listed under `missed`.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import anyio
import msgspec
import numpy as np

from benchmarks.common import print_table, write_result
from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness
from gyre.agents.long_horizon import LongHorizonSettings, long_horizon_command
from gyre.config import EngineConfig, ModelConfig, ProxyConfig, RLConfig, TrainerConfig
from gyre.errors import EngineError
from gyre.tasks.task import Task, load_suite
from gyre.trajectory.pack import pack_batch
from gyre.trajectory.select import Selection, ancestor_mask, select_trajectories
from gyre.trajectory.tree import build_tree

__all__ = [
    "LONG_CONTEXT",
    "long_model",
    "long_engine_config",
    "agent_settings",
    "long_task",
    "run_execution",
    "RssSampler",
    "train_and_sync",
]

ROOT = Path(__file__).resolve().parents[1]
LONG_CONTEXT = 131072
"""The served context: 128K tokens (model positions and vLLM's `max_model_len`)."""
GOALS = {
    "record_peak_bytes_over_token_bytes_700k": 4.0,
    "tree_build_s_700k": 2.0,
    "train_rss_ratio_128k_over_32k": 4.5,
}


def long_model(root: Path) -> Path:
    """The tiny model (seed 0 weights, unchanged) with 131072 positions, built under `root`."""
    from gyre.model import init_model_dir

    return init_model_dir(root / "tiny-128k", ModelConfig(max_position_embeddings=LONG_CONTEXT))


def long_engine_config(**overrides) -> EngineConfig:
    """A vLLM cell serving 128K-token contexts: the KV cache holds one full context (the tiny
    model's KV is 2 layers x 2 x 2 heads x 32 x 4 bytes = 1 KiB a token: 128 MiB) twice over."""
    fields = dict(
        max_model_len=LONG_CONTEXT,
        kv_cache_memory_bytes=256 * 2**20,
        request_timeout_s=600.0,
    )
    return EngineConfig(**{**fields, **overrides})


def agent_settings(target_tokens: int, *, min_calls: int | None = None) -> LongHorizonSettings:
    """The agent for an execution of about `target_tokens`: ~1000-character tool outputs (about
    430 tokens a call with the reply, so 300 calls make ~128K tokens),
    compaction at 16K tokens of context, a sub-agent (5 calls) every 25 main turns; at least 300
    calls from 128K tokens up (fewer, in proportion, below)."""
    if min_calls is None:
        min_calls = max(20, min(300, target_tokens * 300 // 131072))
    return LongHorizonSettings(
        min_calls=min_calls,
        target_tokens=target_tokens,
        compact_at_tokens=16384,
        tool_output_chars=1000,
        sub_agent_every=25,
        sub_agent_calls=5,
        max_tokens=32,
    )


def long_task() -> Task:
    """A `longtail` task (its verifier scores the agent's result.json) with an hour's deadline."""
    return load_suite(ROOT / "examples" / "tasks" / "longtail")[0]


async def run_execution(
    proxy, execution_id: str, settings: LongHorizonSettings, workspace_root: Path
):
    """Run the agent once through `proxy` (served here) under the harness; returns (Outcome, its
    calls in reference form, agent seconds). The execution stays open in the proxy."""
    key = proxy.mint_key(execution_id)

    def refresh(c: ExecutionControl) -> None:
        s = proxy.summary(execution_id)
        c.observe_totals(
            model_calls=s.num_calls,
            completion_tokens=s.completion_tokens,
            context_refusals=s.context_refusals,
        )

    control = ExecutionControl(refresh=refresh, max_turns=10**6, token_budget=10**10)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        harness = Harness(
            base_url=f"http://127.0.0.1:{port}/v1", workspace_root=workspace_root, kill_grace_s=1
        )
        t0 = time.perf_counter()
        outcome = await harness.run(
            long_task(),
            execution_id,
            control=control,
            api_key=key,
            agent_command=list(long_horizon_command(settings)),
        )
        agent_s = time.perf_counter() - t0
        calls = proxy.calls(execution_id)
        tg.cancel_scope.cancel()
    return outcome, calls, agent_s


def select_all(tree) -> Selection:
    """Every path of `tree` (Jmax = its number of leaves)."""
    return select_trajectories(tree, max(1, len(tree.leaves())))


def one_path(tree, leaf: int, role: str) -> Selection:
    """A selection of the single path ending at `leaf`."""
    mask = ancestor_mask(tree, np.asarray([leaf], dtype=np.int64))
    return Selection(
        execution_id=tree.execution_id,
        leaves=np.asarray([leaf], dtype=np.int64),
        roles=(role,),
        node_mask_N=mask,
        policy_tokens=int(np.count_nonzero(tree.policy_N & mask)),
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """This process's RSS sampled every `interval_s` in a thread, while in the `with` block:
    `before` (bytes at entry) and `peak` (the largest sample, bytes)."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.before = self.peak = 0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> RssSampler:
        gc.collect()
        self.before = self.peak = _rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


async def train_and_sync(
    trainer, engine, calls, *, snapshots: Path, micro_batch_tokens: int, one_by_one: bool = False
) -> dict:
    """Tree -> select (every path) -> pack -> one trainer step (advantage +1) -> snapshot ->
    `engine.load_weights`. Returns the step's numbers (seconds, tokens, RSS before and peak);
    with `one_by_one`, also the seconds of forwarding/backwarding each selected path alone
    (gradients dropped; the step itself is unchanged)."""
    execution_id = calls[0].execution_id
    t0 = time.perf_counter()
    tree = build_tree(calls)
    tree_s = time.perf_counter() - t0
    selection = select_all(tree)
    t0 = time.perf_counter()
    micro_batches = pack_batch([(tree, selection)], token_budget=micro_batch_tokens)
    pack_s = time.perf_counter() - t0
    advantages = {execution_id: 1.0}
    out: dict = {}
    if one_by_one:
        seconds = 0.0
        linear = 0
        for leaf, role in zip(selection.leaves, selection.roles):
            sel = one_path(tree, int(leaf), role)
            mbs = pack_batch([(tree, sel)], token_budget=micro_batch_tokens)
            linear += sum(mb.num_tokens for mb in mbs)
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(trainer.accumulate, mbs, advantages)
            seconds += time.perf_counter() - t0
            trainer.zero_grad()
        out.update(one_by_one_s=seconds, linear_tokens=linear)
    with RssSampler() as rss:
        t0 = time.perf_counter()
        stats = await anyio.to_thread.run_sync(trainer.train_batch, micro_batches, advantages)
        train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    snapshot = await anyio.to_thread.run_sync(trainer.save_snapshot, snapshots)
    await engine.load_weights(str(snapshot), trainer.version)
    sync_s = time.perf_counter() - t0
    st = tree.statistics()
    out.update(
        calls=st.calls,
        tree_tokens=st.unique_tokens,
        tokens_in_calls=st.tokens_in_calls,
        depth=st.depth,
        leaves=st.branches,
        selected_paths=len(selection.leaves),
        packed_tokens=sum(mb.num_tokens for mb in micro_batches),
        micro_batches=len(micro_batches),
        tree_s=tree_s,
        pack_s=pack_s,
        train_s=train_s,
        sync_s=sync_s,
        applied=stats.applied,
        version=stats.version,
        loss=stats.loss,
        grad_norm=stats.grad_norm,
        logprob_abs_diff_mean=stats.logprob_abs_diff_mean,
        rss_before_bytes=rss.before,
        rss_peak_bytes=rss.peak,
    )
    return out


async def full_context_call(engine, calls, prompt_tokens: int) -> dict:
    """One generate call (8 tokens, T=1, unseeded) on a prompt of `prompt_tokens` tokens: the
    execution's sequences (every call's prompt + completion, in record order) joined and cut.
    Returns its seconds, prompt length and the versions of the sampled tokens.

    Unseeded: vLLM's CPU worker dies on a seeded request whose prefill is chunked (over
    `max_num_batched_tokens`, 2048 on CPU): it rewinds the request's generator, which a CPU
    generator refuses ("CPU Generator does not use offset")."""
    from gyre.engines.protocol import GenerateRequest, SamplingParams
    from gyre.tito.records import ExecutionTokens

    tokens = ExecutionTokens(calls)
    prompt: list[int] = []
    for c in calls:
        if len(prompt) >= prompt_tokens:
            break
        prompt += tokens.sequence(c.call_id)
    prompt = prompt[:prompt_tokens]
    request = GenerateRequest(
        request_id="long-context", prompt_ids=prompt, sampling=SamplingParams(max_tokens=8)
    )
    ids: list[int] = []
    versions: list[int] = []
    t0 = time.perf_counter()
    async for delta in engine.generate(request):
        ids += delta.token_ids
        versions += delta.versions
    return dict(
        seconds=time.perf_counter() - t0,
        prompt_tokens=len(prompt),
        tokens=len(ids),
        versions=versions,
    )


def _roles(calls) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in calls:
        out[c.role] = out.get(c.role, 0) + 1
    return out


async def real_part(sizes: dict[str, int], work: Path) -> tuple[dict, dict]:
    """Executions of `sizes` tokens on vLLM, each trained one step and synced; then one call on
    a full-context prompt (`full_context_call`). Returns (numbers by size, that call's)."""
    from transformers import AutoTokenizer

    from gyre.cell.spawn import open_cell
    from gyre.engines.trainer import DeepSpeedTrainer
    from gyre.rl import PolicyObjective
    from gyre.tito.proxy import TitoProxy

    model_dir = long_model(work)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = DeepSpeedTrainer(
        model_dir, TrainerConfig(learning_rate=1e-4), PolicyObjective(RLConfig())
    )
    numbers: dict = {}
    async with open_cell(model_dir, long_engine_config(), log_path=work / "cell.log") as engine:
        proxy = TitoProxy(tokenizer=tokenizer, engine_for=lambda _e: engine, config=ProxyConfig())
        for name, target in sizes.items():
            eid = f"long-{name}"
            outcome, calls, agent_s = await run_execution(
                proxy, eid, agent_settings(target), work / f"x-{name}"
            )
            if outcome.termination != "finished":
                raise RuntimeError(f"execution {eid} did not finish: {outcome}")
            await proxy.close(eid)
            step = await train_and_sync(
                trainer,
                engine,
                calls,
                snapshots=work / "snapshots",
                micro_batch_tokens=16384,
                one_by_one=name == "128k",
            )
            step.update(agent_s=agent_s, roles=_roles(calls), score=outcome.score.score)
            step["longest_prompt"] = max(c.prompt_len for c in calls)
            numbers[name] = step
        # the whole context: a prompt of 131072 - 8 tokens, sampled after the last sync; a
        # failure is a result (the numbers above are kept)
        try:
            full = await full_context_call(engine, calls, LONG_CONTEXT - 8)
        except EngineError as exc:
            full = {"error": str(exc), "versions": []}
    return numbers, full


def scripted_proxy(log_path: Path | None):
    """The real proxy on a scripted engine whose replies are text (re-encoding to themselves) of
    up to 32 tokens, with a 131072-token context."""
    from gyre.engines.scripted import ScriptedEngine, ScriptedReply
    from gyre.model.recipe import build_tokenizer
    from gyre.tito.proxy import TitoProxy

    tok = build_tokenizer()

    def rule(request, index: int, vocab_size: int) -> ScriptedReply:
        n = len(engine.requests_seen)
        text = f"step {n}: read the file, then run the test and write the module"
        return ScriptedReply(token_ids=tok.encode(text, add_special_tokens=False)[:32])

    engine = ScriptedEngine(
        rule=rule, eos_token_id=tok.eos_token_id, max_model_len=LONG_CONTEXT, vocab_size=len(tok)
    )
    proxy = TitoProxy(
        tokenizer=tok,
        engine_for=lambda _e: engine,
        config=ProxyConfig(),
        log_path=None if log_path is None else str(log_path),
    )
    return proxy, engine


async def scripted_part(target_tokens: int, work: Path) -> dict:
    """One execution of `target_tokens` on the scripted engine: recording, reading back, tree and
    packing."""
    from gyre.tito.log import read_log

    log_path = work / "calls.log"
    proxy, engine = scripted_proxy(log_path)
    engine.requests_seen.clear()
    settings = agent_settings(target_tokens, min_calls=300)
    eid = "long-700k"
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    outcome, calls, agent_s = await run_execution(proxy, eid, settings, work / "x-700k")
    await proxy.close(eid)
    record_peak = tracemalloc.get_traced_memory()[1] - base
    del calls
    engine.requests_seen.clear()  # the scripted engine's own copy of every request
    gc.collect()
    base_read = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    calls = read_log(log_path).for_execution(eid)
    read_s = time.perf_counter() - t0
    read_peak = tracemalloc.get_traced_memory()[1] - base_read
    tracemalloc.stop()
    if outcome.termination != "finished":
        raise RuntimeError(f"execution {eid} did not finish: {outcome}")
    t0 = time.perf_counter()
    tree = build_tree(calls)
    tree_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    selection = select_all(tree)
    select_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    micro_batches = pack_batch([(tree, selection)], token_budget=16384)
    pack_s = time.perf_counter() - t0
    st = tree.statistics()
    token_bytes = sum(getattr(tree, n).nbytes for n in tree.__slots__ if n.endswith("_N"))
    return dict(
        calls=st.calls,
        roles=_roles(calls),
        tree_tokens=st.unique_tokens,
        tokens_in_calls=st.tokens_in_calls,
        depth=st.depth,
        leaves=st.branches,
        longest_prompt=max(c.prompt_len for c in calls),
        agent_s=agent_s,
        token_bytes=token_bytes,
        token_id_bytes=int(tree.token_N.nbytes),
        log_bytes=log_path.stat().st_size,
        record_peak_bytes=record_peak,
        read_peak_bytes=read_peak,
        read_s=read_s,
        tree_s=tree_s,
        select_s=select_s,
        pack_s=pack_s,
        packed_tokens=sum(mb.num_tokens for mb in micro_batches),
        micro_batches=len(micro_batches),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-real", action="store_true", help="no vLLM / DeepSpeed part")
    parser.add_argument("--skip-scripted", action="store_true", help="no 700K scripted part")
    parser.add_argument(
        "--scripted-tokens",
        type=int,
        default=700 * 1024,
        help="the agent's token target (the tree holds ~1%% fewer: fresh histories share heads)",
    )
    parser.add_argument("--sizes", default="32k=32768,128k=131072", help="name=tokens,...")
    parser.add_argument("--work", help="folder kept for the models, logs and snapshots")
    args = parser.parse_args(argv)
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(","))}
    numbers: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        work = Path(args.work or tmp).resolve()
        if not args.skip_scripted:
            s = anyio.run(scripted_part, args.scripted_tokens, work / "scripted", backend="trio")
            numbers["scripted_700k"] = s
            peak = max(s["record_peak_bytes"], s["read_peak_bytes"])
            numbers["record_peak_bytes_over_token_bytes_700k"] = peak / s["token_bytes"]
            numbers["record_peak_bytes_over_token_id_bytes_700k"] = peak / s["token_id_bytes"]
            numbers["tree_build_s_700k"] = s["tree_s"]
            print_table("scripted engine", [{k: v for k, v in s.items() if k != "roles"}])
        if not args.skip_real:
            real, full = anyio.run(real_part, sizes, work / "real", backend="trio")
            numbers["real"] = real
            numbers["full_context_call"] = {k: v for k, v in full.items() if k != "versions"}
            numbers["full_context_call"]["version"] = sorted(set(full["versions"]))
            for name, r in real.items():
                numbers[f"train_peak_rss_bytes_{name}"] = r["rss_peak_bytes"]
                numbers[f"train_rss_growth_bytes_{name}"] = (
                    r["rss_peak_bytes"] - r["rss_before_bytes"]
                )
            if "128k" in real:
                r = real["128k"]
                numbers["train_s_128k"] = r["train_s"]
                numbers["train_tokens_per_s_128k"] = r["packed_tokens"] / r["train_s"]
                numbers["train_time_ratio_vs_linear_128k"] = r["train_s"] / r["one_by_one_s"]
            if {"32k", "128k"} <= real.keys():
                numbers["train_rss_ratio_128k_over_32k"] = (
                    numbers["train_rss_growth_bytes_128k"] / numbers["train_rss_growth_bytes_32k"]
                )
                numbers["train_rss_ratio_128k_over_32k_absolute"] = (
                    numbers["train_peak_rss_bytes_128k"] / numbers["train_peak_rss_bytes_32k"]
                )
            print_table(
                "real engines",
                [
                    {"size": k, **{f: v for f, v in r.items() if f != "roles"}}
                    for k, r in real.items()
                ],
            )
    numbers["missed"] = {
        key: {"goal_at_most": goal, "measured": numbers[key]}
        for key, goal in GOALS.items()
        if key in numbers and numbers[key] > goal
    }
    numbers["max_rss_bytes_of_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    config = dict(
        scripted_tokens=args.scripted_tokens,
        sizes=sizes,
        context_tokens=LONG_CONTEXT,
        micro_batch_tokens=16384,
        agent=msgspec.to_builtins(agent_settings(131072).__dict__),
        token_bytes="the execution's token arrays: the per-token (_N) arrays of its trajectory "
        "tree (as bench_records and bench_tree); token_id_bytes: its int32 token IDs alone",
        train_rss_ratio="RSS growth during the step (peak - RSS before it), 128K over 32K",
    )
    path = write_result("long", config, numbers)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
