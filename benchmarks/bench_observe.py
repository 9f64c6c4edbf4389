"""Observe: what the live run page costs a run's steps while 3 clients watch it.

The same short elastic run (3 cell doubles: scripted engines and ledger trainers from
`tests/runtime/fake_cells.py`, real agents through the TITO proxy, router and harness on this
node) runs with the page off and with the page on and 3 clients polling it, alternately, `--pairs`
times (ABBA order, so drift in the machine's load cancels). Each client is a separate process
that does what an open page does every poll interval (1 s): one request for the view on screen,
moving through the views (cells with its cursor, steps, executions, the newest execution's tree
and its first call's tokens). The page's file reads and tree building compete with the node's
event loop, proxy and agents for this machine's CPUs; the clients, standing in for browsers that
normally run on the viewer's machine, run at nice 19 outside the node's process.
`step_overhead_ratio` = mean step seconds with the page watched / mean step seconds without it
(`StepMetrics.step_s` of every step); `node_cpu_s_per_step_*` is the node process's CPU (all its
threads) per step, and `step_overhead_ratio_cpu_bound` = 1 + the page's CPU per step (watched -
unwatched) / the unwatched step's wall time: the step's slowdown if every CPU-second the page
takes came out of the step, a bound that the machine's load does not blur. A 10,000-execution
call log is then indexed and served (`10000_*` seconds).
Writes benchmarks/results/observe.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio

from benchmarks.common import print_table, write_result

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "tests/runtime/coin_agent.py"
SUITE = REPO / "examples/tasks/learnable"
B, G, CELLS, CAP = 4, 2, 3, 2
CLIENTS = 3
POLL_S = 1.0
SECRET = "bench-observe-" + "s" * 24


_stop = False


def _on_term(*_: object) -> None:
    global _stop
    _stop = True


def client(base: str, secret: str, seconds: float, first_view: int) -> None:
    """One watcher, as an open page polls: one request per poll interval, for the view on screen
    (the page polls only that one). It moves to the next view every poll, starting at
    `first_view`: cells (with its cursor), steps, executions, the newest execution's tree (and
    the tokens of its first call, as a click would). Prints polls and their mean latency."""
    import httpx

    headers = {"Authorization": f"Bearer {secret}"}
    cursor = {"intervals": 0, "roles": 0, "water": 0}
    newest = None
    latencies = []
    end = time.monotonic() + seconds
    tick = first_view
    with httpx.Client(base_url=base, headers=headers, timeout=30) as c:
        while time.monotonic() < end and not _stop:
            t0 = time.monotonic()
            view = tick % 4
            tick += 1
            try:
                if view == 0:
                    cursor = c.get("/api/cells", params=cursor).json()["cursor"]
                elif view == 1:
                    c.get("/api/steps").raise_for_status()
                elif view == 2 or newest is None:
                    rows = c.get("/api/executions", params={"page_size": 50}).json()["rows"]
                    newest = next((r["execution_id"] for r in rows if r["calls"]), newest)
                else:
                    c.get(f"/api/executions/{newest}").raise_for_status()
                    path = f"/api/executions/{newest}/segments/0"
                    c.get(path, params={"limit": 1024}).raise_for_status()
            except httpx.TransportError:
                break  # the page stopped
            if not latencies:
                print("ready", flush=True)
            latencies.append(time.monotonic() - t0)
            time.sleep(max(0.0, POLL_S - (time.monotonic() - t0)))
    print(f"{len(latencies)} {statistics.mean(latencies) if latencies else 0.0:.6f}", flush=True)


def config(run_dir: Path, steps: int):
    from gyre.config import config_from_dict

    return config_from_dict(
        {
            "run_dir": str(run_dir),
            "seed": 1,
            "loop": {"steps": steps, "batch_executions": B, "group_size": G},
            "cells": {"num_cells": CELLS},
            "scheduler": {"policy": "elastic", "capacity_per_cell": CAP},
            "tasks": {"suites": [str(SUITE)], "harness": {"agent_command": ["python", str(AGENT)]}},
            "router": {"no_cell_timeout_s": 60},
        }
    )


async def one_run(run_dir: Path, steps: int, watched: bool) -> dict:
    from gyre.engines.scripted import ScriptedEngine
    from gyre.model.recipe import build_tokenizer
    from gyre.report.live import RuntimeFeed, open_page
    from gyre.report.live.server import view_for
    from gyre.runtime.cell_handle import CellHandle
    from gyre.runtime.elastic_job import run_cells
    from gyre.runtime.metrics import StepMetrics, read_metrics
    from gyre.tasks.task import load_suite
    from tests.runtime.fake_cells import Exchange, FakeTrainingCell  # cell doubles

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = config(run_dir, steps)
    tok = build_tokenizer()
    exchange = Exchange()
    fakes = [
        FakeTrainingCell(
            i,
            ScriptedEngine(eos_token_id=tok.eos_token_id, vocab_size=len(tok), max_model_len=4096),
            exchange,
        )
        for i in range(CELLS)
    ]
    cells = [CellHandle(name=f"cell-{i}", client=f) for i, f in enumerate(fakes)]
    tasks = load_suite(SUITE)
    watchers: list[subprocess.Popen] = []
    outs: list[tuple[str, str]] = []
    t0, cpu0 = time.monotonic(), time.process_time()
    if not watched:
        await run_cells(cfg, cells, tokenizer=tok, tasks=tasks, snapshot="model", launch="L")
    else:
        feed = RuntimeFeed()
        view = view_for(cfg, decode=lambda ids: [tok.decode([i]) for i in ids])
        async with open_page(view, secret=SECRET, snapshot=feed.snapshot, announce=None) as page:
            watchers = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.bench_observe",
                        "--client",
                        page.base_url,
                        "--seconds",
                        "3600",
                        "--first-view",
                        str(k),
                    ],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for k in range(CLIENTS)
            ]
            for w in watchers:  # every client polls before the run starts
                assert await anyio.to_thread.run_sync(w.stdout.readline) == "ready\n"
            try:
                await run_cells(
                    cfg,
                    cells,
                    tokenizer=tok,
                    tasks=tasks,
                    snapshot="model",
                    launch="L",
                    on_runtime=feed.attach,
                )
            finally:
                wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
                for w in watchers:
                    w.terminate()
                # the page keeps serving until every client has finished its last poll
                outs = [await anyio.to_thread.run_sync(w.communicate) for w in watchers]
    polls = []
    for out, _ in outs:
        n, mean_s = out.split()[-2:]
        polls.append({"polls": int(n), "poll_s_mean": float(mean_s)})
    if not watched:
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    steps_s = [r.step_s for r in read_metrics(run_dir) if isinstance(r, StepMetrics)]
    return {
        "watched": watched,
        "step_s": steps_s,
        "step_s_mean": statistics.mean(steps_s),
        "wall_s": wall,
        "client_polls": polls,
        "node_cpu_s": cpu,
    }


def big_run(run_dir: Path, executions: int) -> dict:
    """A call log of `executions` executions (3 calls each, one a compaction): seconds to index it
    from scratch, to answer a page of executions, a state-filtered page and one tree, through the
    page's app (ASGI, in process)."""
    import httpx

    from gyre.engines.protocol import SamplingParams
    from gyre.report.live import PageAuth, RunView, page_app
    from gyre.tito.log import CallEntry, encode_frame
    from gyre.tito.records import Divergence, FullCall, to_reference

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    frames = bytearray()
    for e in range(executions):
        eid = f"x{e}"
        calls = [
            FullCall(
                execution_id=eid,
                call_id=f"c{k}",
                role="main",
                prompt_ids=prompt,
                completion_ids=list(range(300, 350)),
                logprobs=[-1.0] * 50,
                versions=[1] * 50,
                finish_reason="stop",
                parent_call_id=f"c{k - 1}" if k else None,
                sampling=SamplingParams(),
                divergence=Divergence(parent_call_id="c1", index=100, reason=div) if div else None,
            )
            for k, (prompt, div) in enumerate(
                [
                    (list(range(200)), None),
                    (list(range(250)), None),
                    (list(range(100)) + [7] * 50, "compaction"),
                ]
            )
        ]
        for call in to_reference(calls):  # as the proxy records them
            frames += encode_frame(CallEntry(call=call))
    (run_dir / "calls.log").write_bytes(bytes(frames))
    view = RunView(run_dir)
    t0 = time.perf_counter()
    view.calls.refresh()
    index_s = time.perf_counter() - t0
    app = page_app(view, PageAuth(SECRET))

    async def timed() -> dict:
        out = {}
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {SECRET}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://p", headers=headers
        ) as c:
            for name, path in [
                ("executions_page_s", "/api/executions?page=100"),
                ("executions_filtered_s", "/api/executions?state=running&q=x99"),
                ("tree_s", "/api/executions/x5000"),
                ("tree_tokens_s", "/api/executions/x5000/segments/2?limit=1024"),
            ]:
                t = time.perf_counter()
                r = await c.get(path)
                r.raise_for_status()
                out[f"{executions}_{name}"] = time.perf_counter() - t
        return out

    return {
        f"{executions}_index_s": index_s,
        f"{executions}_log_bytes": len(frames),
        **anyio.run(timed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--executions", type=int, default=10_000, help="executions of the big log")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=60, help=argparse.SUPPRESS)
    parser.add_argument("--first-view", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        signal.signal(signal.SIGTERM, _on_term)
        os.nice(19)  # a viewer's browser runs elsewhere: on this box the watchers yield the CPU
        client(args.client, SECRET, args.seconds, args.first_view)
        return
    run_dir = REPO / "runs" / "bench-observe"
    runs = []
    for i in range(args.pairs):
        for watched in (False, True) if i % 2 == 0 else (True, False):  # ABBA: drift cancels
            r = anyio.run(one_run, run_dir, args.steps, watched, backend="trio")
            print(f"pair {i} watched={watched}: mean step {r['step_s_mean']:.3f} s", flush=True)
            runs.append(r)
    off = [s for r in runs if not r["watched"] for s in r["step_s"]]
    on = [s for r in runs if r["watched"] for s in r["step_s"]]
    numbers = {
        "step_overhead_ratio": statistics.mean(on) / statistics.mean(off),
        "step_s_mean_unwatched": statistics.mean(off),
        "step_s_mean_watched": statistics.mean(on),
        "step_s_median_unwatched": statistics.median(off),
        "step_s_median_watched": statistics.median(on),
        "goal_ratio_max": 1.02,
        "wall_step_s_mean_per_run_min": min(r["step_s_mean"] for r in runs),
        "wall_step_s_mean_per_run_max": max(r["step_s_mean"] for r in runs),
        "node_cpu_s_per_step_unwatched": sum(r["node_cpu_s"] for r in runs if not r["watched"])
        / len(off),
        "node_cpu_s_per_step_watched": sum(r["node_cpu_s"] for r in runs if r["watched"]) / len(on),
        "client_poll_s_mean": statistics.mean(
            p["poll_s_mean"] for r in runs if r["watched"] for p in r["client_polls"]
        ),
        **big_run(REPO / "runs" / "bench-observe-10k", args.executions),
        "runs": runs,
    }
    params = {
        "pairs": args.pairs,
        "steps": args.steps,
        "cells": CELLS,
        "batch_executions": B,
        "group_size": G,
        "clients": CLIENTS,
        "poll_interval_s": POLL_S,
        "agent": "tests/runtime/coin_agent.py",
        "cells_kind": "tests/runtime/fake_cells.py doubles (scripted engines)",
    }
    # The page's own CPU per step over the step's wall time: what it would add to the step if every
    # CPU-second it takes were taken from the step (one busy core), free of the machine's noise.
    page_cpu = numbers["node_cpu_s_per_step_watched"] - numbers["node_cpu_s_per_step_unwatched"]
    numbers["page_cpu_s_per_step"] = page_cpu
    numbers["step_overhead_ratio_cpu_bound"] = (
        1 + max(0.0, page_cpu) / numbers["step_s_mean_unwatched"]
    )
    path = write_result("observe", params, numbers)
    print_table(
        "observe (mean step seconds)",
        [
            {"page": "off", "step_s_mean": numbers["step_s_mean_unwatched"], "steps": len(off)},
            {
                "page": f"on, {CLIENTS} clients",
                "step_s_mean": numbers["step_s_mean_watched"],
                "steps": len(on),
            },
        ],
    )
    print(
        f"step_overhead_ratio {numbers['step_overhead_ratio']:.4f} (wall), "
        f"{numbers['step_overhead_ratio_cpu_bound']:.4f} (page CPU / step wall); wrote {path}"
    )


if __name__ == "__main__":
    main()
