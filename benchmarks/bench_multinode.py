"""Several hosts on one machine: a head node and worker nodes, each in a network namespace of its
own (`tests/runtime/netns_hosts.py`: 10.200.0.1, .2, .3 on a private bridge), running a real
multi-cell run: `python -m gyre.node --config F` in the head's namespace, `python -m gyre.node
--join 10.200.0.1:PORT` in each worker's, scripted-engine cells each with a DeepSpeed trainer on
the tiny model, one gloo gradient group over the hosts, the colocate policy, the agents of
`bench_faults.py` (run by the head).

Numbers:
- `step_s_ratio_2hosts_over_1host`: mean step seconds (steps 2 and 3) of 2 cells split over 2
  hosts (head + 1 worker, 1 cell each) over the same 2 cells on one host (goal <= 1.15);
- `worker_kill_lost_executions`: head + 2 workers, kill -9 of one worker (its cell dies with it)
  once step 2 is written, mid-step 3; the call log held against what the agents received
  (`audit_calls`: goal 0, with 0 calls duplicated and 3 steps done);
- `join_s`: seconds from starting the workers until the head holds all their ready cells.

Run: `.venv/bin/python -m benchmarks.bench_multinode` (root) -> benchmarks/results/multinode.json
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_faults  # noqa: E402
from benchmarks.common import print_table, write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SECRET = "multinode-test-secret"
JOIN_PORT = 29400


class ClusterRun(bench_faults.Node):
    """One run over namespace hosts: the head node in `hosts[0]`, workers in the others."""

    def __init__(self, name: str, hosts, *, steps: int, cells_per_host: int, workers: int):
        config = bench_faults.node_config(
            bench_faults.ROOT / name / "run", steps, cells=max(2, cells_per_host)
        )
        config["cells"] = {"num_cells": cells_per_host}
        if workers:
            config["cluster"] = {
                "workers": workers,
                "host": hosts[0].address,
                "port": JOIN_PORT,
                "secret": SECRET,
            }
        super().__init__(name, config)
        self.hosts = hosts
        self.workers: list[subprocess.Popen] = []
        self.workers_started = 0.0

    def start(self, resume: bool = False) -> subprocess.Popen:
        self.launches += 1
        cmd = self.hosts[0].command([PY, "-m", "gyre.node", "--config", str(self.toml)])
        log = open(self.dir / f"node-{self.launches}.log", "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self.proc

    def start_worker(self, i: int, secret: str = SECRET) -> subprocess.Popen:
        head = f"{self.hosts[0].address}:{JOIN_PORT}"
        cmd = self.hosts[i].command([PY, "-m", "gyre.node", "--join", head])
        log = open(self.dir / f"worker-{i}-{secret[:5]}.log", "wb")
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "GYRE_JOIN_SECRET": secret},
        )
        return proc

    def start_workers(self) -> None:
        self.workers_started = time.time()
        self.workers = [self.start_worker(i) for i in range(1, len(self.hosts))]

    def head_log(self) -> str:
        return (self.dir / f"node-{self.launches}.log").read_text(errors="replace")

    def wait_head_listening(self, timeout_s: float = 300) -> bool:
        return bool(
            bench_faults.wait_for(lambda: "waiting for" in self.head_log(), timeout_s, self.proc)
        )

    def join_s(self) -> float | None:
        """Seconds from starting the workers to the head's last `offered cells` log line."""
        stamps = re.findall(r"^(\S+ \S+) \S+ INFO worker \d+ offered", self.head_log(), re.M)
        if len(stamps) < len(self.workers):
            return None
        last = max(datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f").timestamp() for s in stamps)
        return round(last - self.workers_started, 2)

    def steps_written(self) -> int:
        from gyre.runtime.metrics import StepMetrics, read_metrics

        try:
            return sum(isinstance(r, StepMetrics) for r in read_metrics(self.run_dir))
        except FileNotFoundError:
            return 0

    def step_s(self) -> list[float]:
        from gyre.runtime.metrics import StepMetrics, read_metrics

        return [r.step_s for r in read_metrics(self.run_dir) if isinstance(r, StepMetrics)]

    def wait_workers(self, timeout_s: float = 60) -> list[int | None]:
        codes = []
        for proc in self.workers:
            try:
                codes.append(proc.wait(timeout=timeout_s))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                codes.append(None)
        return codes


def audit_calls(run: ClusterRun, steps: int) -> dict:
    """The elastic runtime keeps no execution ledger: every execution folder the harness kept is
    held against the call log. `calls_duplicated`: call-log records beyond the replies its agent
    printed (or repeated prompts); `executions_lost`: batch slots of the steps written that no
    finished execution filled, plus executions with records and no agent output."""
    from collections import Counter

    from gyre.runtime.metrics import StepMetrics, read_metrics
    from gyre.tito.log import read_log

    B = run.config["loop"]["batch_executions"]
    records = [r for r in read_metrics(run.run_dir) if isinstance(r, StepMetrics)]
    lost = sum(max(0, B - (r.executions - r.failed)) for r in records)
    log = read_log(run.run_dir / "calls.log")
    ws = Path(run.config["tasks"]["harness"]["workspace_root"])
    duplicated, checked, without = 0, 0, 0
    for folder in sorted(p for p in ws.iterdir() if p.is_dir()):
        calls = log.for_execution(folder.name)
        out = folder / "stdout.log"
        if not out.exists():
            without += bool(calls)
            continue
        received = [ln for ln in out.read_text().splitlines() if ln.startswith('{"received"')]
        prompts = Counter(_prompt_key(c) for c in calls)
        duplicated += max(len(calls) - len(received), sum(c - 1 for c in prompts.values()))
        checked += 1
    return {
        "steps_done": [r.step for r in records],
        "executions_trained": sum(r.executions for r in records),
        "executions_failed": sum(r.failed for r in records),
        "executions_lost": lost + without,
        "calls_duplicated": duplicated,
        "executions_checked_against_agents": checked,
        "log_torn_bytes": log.torn_bytes,
        "log_unresolved": log.unresolved,
    }


def _prompt_key(call) -> tuple:
    """What identifies a call's prompt: its whole token IDs, or in reference form (`ModelCall`:
    parent, shared prefix length, own tail) the same thing without rebuilding it."""
    if hasattr(call, "prompt_ids"):
        return tuple(call.prompt_ids)
    return (call.parent_call_id, call.shared_len, tuple(call.prompt_tail))


def wrong_secret_join(hosts) -> dict:
    """A worker with a wrong secret against a head waiting for 1 worker: both sides' lines."""
    run = ClusterRun("multinode-refused", hosts[:2], steps=1, cells_per_host=1, workers=1)
    run.start()
    listening = run.wait_head_listening()
    bad = run.start_worker(1, secret="wrong-secret")
    try:
        rc = bad.wait(timeout=120)
    except subprocess.TimeoutExpired:
        bad.kill()
        rc = None
    worker_log = (run.dir / "worker-1-wrong.log").read_text(errors="replace")
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    return {
        "head_listening": listening,
        "worker_exit_code": rc,
        "worker_error": next((ln for ln in worker_log.splitlines() if "error" in ln), ""),
        "head_refusal": next((ln for ln in run.head_log().splitlines() if "refused" in ln), ""),
    }


def cluster_run(hosts, name: str, *, cells_per_host: int, kill_worker: int | None = None):
    """A 3-step run over `hosts` (head + len(hosts) - 1 workers); with `kill_worker`, kill -9 of
    that worker once step 2 is written. Returns (run, result dict)."""
    workers = len(hosts) - 1
    run = ClusterRun(name, hosts, steps=3, cells_per_host=cells_per_host, workers=workers)
    t0 = time.monotonic()
    run.start()
    if workers:
        run.wait_head_listening()
        run.start_workers()
    killed = False
    if kill_worker is not None:
        ok = bench_faults.wait_for(lambda: run.steps_written() >= 2, 900, run.proc, poll_s=0.05)
        if ok:
            os.kill(run.workers[kill_worker - 1].pid, signal.SIGKILL)
            killed = True
    rc = run.wait(900)
    worker_codes = run.wait_workers()
    log = run.head_log()
    return run, {
        "hosts": len(hosts),
        "cells": cells_per_host * len(hosts),
        "exit_code": rc,
        "worker_exit_codes": worker_codes,
        "killed_worker": kill_worker if killed else None,
        "join_s": run.join_s() if workers else None,
        "step_s": [round(s, 2) for s in run.step_s()],
        "wall_s": round(time.monotonic() - t0, 1),
        "groups_trained_again": len(re.findall(r"died while training group", log)),
        "worker_lost_lines": len(re.findall(r"went away: its cells are lost", log)),
        "what_happened": run.log_tail(),
        **audit_calls(run, 3),
    }


def main() -> None:
    from tests.runtime.netns_hosts import namespace_hosts, unavailable

    reason = unavailable()
    if reason:
        raise SystemExit(f"bench_multinode: {reason}")
    rows = []
    with namespace_hosts(3) as hosts:
        one_run, one = cluster_run(hosts[:1], "multinode-1host", cells_per_host=2)
        two_run, two = cluster_run(hosts[:2], "multinode-2hosts", cells_per_host=1)
        kill_run, kill = cluster_run(hosts, "multinode-kill", cells_per_host=1, kill_worker=2)
        refused = wrong_secret_join(hosts)
    for label, r in (("1 host x 2 cells", one), ("2 hosts x 1 cell", two), ("kill", kill)):
        rows.append(
            {
                "run": label,
                "exit": r["exit_code"],
                "step_s": r["step_s"],
                "join_s": r["join_s"],
                "lost": r["executions_lost"],
                "dup_calls": r["calls_duplicated"],
            }
        )
    print_table("multinode", rows)

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    ratio = mean(two["step_s"][1:]) / mean(one["step_s"][1:])
    numbers = {
        "step_s_ratio_2hosts_over_1host": round(ratio, 3),
        "worker_kill_lost_executions": kill["executions_lost"],
        "worker_kill_calls_duplicated": kill["calls_duplicated"],
        "worker_kill_steps_done": kill["steps_done"],
        "join_s": two["join_s"],
        "join_s_2_workers": kill["join_s"],
        "runs": {"one_host": one, "two_hosts": two, "worker_kill": kill},
        "wrong_secret": refused,
    }
    config = {
        "hosts": "network namespaces 10.200.0.1-3 on a private bridge",
        "engine": "scripted cells, DeepSpeed trainer on the tiny model, gloo gradient group",
        "loop": two_run.config["loop"],
        "scheduler": two_run.config["scheduler"],
        "kill": "kill -9 of worker 2 once step 2 is in metrics.jsonl (mid-step 3)",
        "step_s": "mean of steps 2 and 3 (step 1 includes the first role switches)",
        "cluster": {k: v for k, v in kill_run.config["cluster"].items() if k != "secret"},
    }
    print(write_result("multinode", config, numbers))


if __name__ == "__main__":
    main()
