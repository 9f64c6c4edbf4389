"""Soak: 1,000 concurrent sessions against the TITO proxy in front of the scripted engine.

The server (`benchmarks/soak_server.py`: the proxy and the scripted engine, Hypercorn on loopback,
trio, as the node serves them) runs in a process of its own, so its RSS is measured alone. This
process is the agents: `--sessions` concurrent loops (aiohttp, one connection each), each one
execution after another (its own key, opened and closed through the server's control pipe as the
harness does), each execution a multi-turn chat of 4-12 calls that extend the history they were
given (every `--stream-every`-th call streamed). Loops stop by themselves at `--duration-s`.

Latency is counted after `--warmup-s`. The RSS baseline is taken once `--warmup-s` has passed and
every session has closed its first execution (the working set of 1,000 open histories is built);
a run too short for that (a quick try) takes it at `--warmup-s` and says `warmup_steady: false`.
Measured: requests, errors (any non-200, exception or a closed execution whose record count
differs from the replies its session received), latency p50 / p99 after the warm-up, and the
server's RSS after the warm-up and at the end (`rss_growth_ratio`; goal <= 1.2).

Run: `.venv/bin/python -m benchmarks.bench_soak [--duration-s 600]` -> benchmarks/results/soak.json
(the default run takes the duration plus about a minute of start-up and wind-down).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import print_table, write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = (
    "the file line read write run test pass fail value name path src main def return import class"
).split()


def words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi)))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Server:
    """The soak server process and its control pipe (one request line, one answer line)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lock = asyncio.Lock()

    async def ask(self, line: str) -> str:
        async with self.lock:
            self.proc.stdin.write(line.encode() + b"\n")
            await self.proc.stdin.drain()
            answer = (await self.proc.stdout.readline()).decode().strip()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"control {line!r}: {answer!r}")
        return answer


class Tally:
    def __init__(self) -> None:
        self.requests = 0
        self.streamed = 0
        self.errors = 0
        self.error_samples: list[str] = []
        self.executions = 0
        self.mismatched = 0
        self.latencies_ms: list[float] = []
        self.measuring = False
        self.cycled: set[int] = set()  # sessions that closed at least one execution

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(what[:300])


async def one_call(http, url, key, messages, stream: bool) -> str:
    body = {"model": "gyre", "max_tokens": 24, "messages": messages}
    if stream:
        body["stream"] = True
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        if not stream:
            return (await resp.json())["choices"][0]["message"]["content"] or ""
        parts, done = [], False
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices", ()):
                parts.append((choice.get("delta") or {}).get("content") or "")
        if not done:
            raise RuntimeError("stream ended without [DONE]")
        return "".join(parts)


async def session(sid: int, server: Server, http, url: str, deadline: float, args, tally: Tally):
    rng = random.Random(sid)
    gen = 0
    while time.monotonic() < deadline:
        eid = f"soak-{sid}-{gen}"
        gen += 1
        key = (await server.ask(f"open {eid}")).split()[1]
        messages = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": words(rng, 20, 60)},
        ]
        received = 0
        for _ in range(rng.randint(4, 12)):
            if time.monotonic() >= deadline:
                break
            stream = (tally.requests % args.stream_every) == 0
            t0 = time.perf_counter()
            try:
                content = await one_call(http, url, key, messages, stream)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, none is retried
                tally.requests += 1
                tally.error(f"{eid}: {type(exc).__name__}: {exc}")
                break
            ms = (time.perf_counter() - t0) * 1e3
            tally.requests += 1
            tally.streamed += stream
            received += 1
            if tally.measuring:
                tally.latencies_ms.append(ms)
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": words(rng, 5, 40)},
            ]
        recorded = int((await server.ask(f"close {eid}")).split()[1])
        tally.executions += 1
        tally.cycled.add(sid)
        if recorded != received:
            tally.mismatched += 1
            tally.error(f"{eid}: {recorded} records for {received} replies received")


async def main(args) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2 sockets a session, both ends
    tmp = tempfile.TemporaryDirectory(prefix="gyre-soak-")
    log_path = Path(tmp.name) / "calls.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.soak_server",
        str(log_path),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    server = Server(proc)
    first = (await proc.stdout.readline()).decode().split()
    assert first and first[0] == "port", f"server did not start: {first}"
    url = f"http://127.0.0.1:{first[1]}/v1/chat/completions"
    tally = Tally()
    rss: list[tuple[float, float]] = []
    t_start = time.monotonic()
    deadline = t_start + args.duration_s
    warm_until = t_start + args.warmup_s
    rss_warm = warm_at = None

    async def sample_rss() -> None:
        nonlocal rss_warm, warm_at
        while True:
            now = time.monotonic()
            rss.append((round(now - t_start, 1), rss_mb(proc.pid)))
            tally.measuring = now >= warm_until
            if rss_warm is None and now >= warm_until and len(tally.cycled) >= args.sessions:
                rss_warm, warm_at = rss[-1][1], rss[-1][0]
            await asyncio.sleep(5)

    connector = aiohttp.TCPConnector(limit=args.sessions + 16, force_close=False)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        sampler = asyncio.create_task(sample_rss())
        await asyncio.gather(
            *(session(i, server, http, url, deadline, args, tally) for i in range(args.sessions))
        )
        wall_s = time.monotonic() - t_start
        sampler.cancel()
    rss_end = rss_mb(proc.pid)
    steady = rss_warm is not None
    if not steady:  # no session cycle fit the run (a short try): baseline at --warmup-s
        rss_warm, warm_at = next(((r, t) for t, r in rss if t >= args.warmup_s), rss[-1][::-1])
    stats = json.loads((await server.ask("stats")).split(" ", 1)[1])
    proc.stdin.write(b"quit\n")
    await proc.stdin.drain()
    await proc.wait()
    log_bytes = log_path.stat().st_size
    tmp.cleanup()

    lat = sorted(tally.latencies_ms)
    q = statistics.quantiles(lat, n=1000) if len(lat) >= 2 else [float("nan")] * 999
    numbers = {
        "sessions": args.sessions,
        "executions": tally.executions,
        "requests": tally.requests,
        "streamed_requests": tally.streamed,
        "errors": tally.errors,
        "error_samples": tally.error_samples,
        "records_mismatched": tally.mismatched,
        "requests_per_s": tally.requests / wall_s,
        "p50_ms": q[499],
        "p99_ms": q[989],
        "p999_ms": q[998],
        "max_ms": lat[-1] if lat else float("nan"),
        "latency_samples": len(lat),
        "rss_after_warmup_mb": rss_warm,
        "warmup_ended_s": warm_at,
        "warmup_steady": steady,
        "rss_end_mb": rss_end,
        "rss_peak_mb": max(r for _, r in rss),
        "rss_growth_ratio": rss_end / rss_warm if rss_warm else float("nan"),
        "rss_samples_mb": rss,
        "wall_s": wall_s,
        "call_log_bytes": log_bytes,
        "proxy_statistics": stats,
        "goal_errors_met": tally.errors == 0,
        "goal_rss_met": bool(rss_warm) and rss_end / rss_warm <= 1.2,
    }
    config = {
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "sessions": args.sessions,
        "calls_per_execution": "4-12 (seeded per session)",
        "stream_every": args.stream_every,
        "max_tokens": 24,
        "engine": "scripted (in the server process)",
        "transport": "aiohttp client process -> HTTP/1.1 loopback -> Hypercorn (trio) -> "
        "TITO proxy",
        "request_timeout_s": args.request_timeout_s,
        "goals": ["sessions >= 1000", "errors == 0", "rss_growth_ratio <= 1.2"],
    }
    path = write_result(args.name, config, numbers)
    print_table(
        "TITO proxy soak (scripted engine)",
        [
            {
                k: numbers[k]
                for k in (
                    "sessions",
                    "executions",
                    "requests",
                    "errors",
                    "requests_per_s",
                    "p50_ms",
                    "p99_ms",
                    "rss_after_warmup_mb",
                    "rss_end_mb",
                    "rss_growth_ratio",
                )
            }
        ],
    )
    print(f"-> {path}")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="RSS baseline and latency start after this and once every session "
        "closed an execution (default: 10%% of the run, >= 20 s)",
    )
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--stream-every", type=int, default=4)
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument("--name", default="soak", help="result file: benchmarks/results/<name>.json")
    args = p.parse_args(argv)
    if args.warmup_s is None:
        args.warmup_s = max(20.0, 0.1 * args.duration_s)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
