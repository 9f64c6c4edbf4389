"""The proxy faults of `bench_faults.py`: the disk filling under the call log, and a streamed
call whose connection drops mid-way. Each runs the TITO proxy over Hypercorn (trio, as the node
does) in front of the scripted engine, in this process, and compares what the client received
with what the call log holds afterwards. Knows nothing about nodes, cells or training.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections import Counter
from pathlib import Path

import anyio
import httpx

from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.model.recipe import build_tokenizer
from gyre.tito.log import read_log
from gyre.tito.proxy import TitoProxy


def _proxy(log_path: Path, *, token_delay_s: float = 0.0, reply_tokens: int = 6):
    tok = build_tokenizer()
    reply = tok.encode(
        " the file is read and the test will pass now" * 4, add_special_tokens=False
    )[:reply_tokens] + [tok.eos_token_id]
    engine = ScriptedEngine(
        rule=lambda req, i, v: ScriptedReply(token_ids=reply),
        eos_token_id=tok.eos_token_id,
        max_model_len=65_536,
        token_delay_s=token_delay_s,
    )
    proxy = TitoProxy(
        tokenizer=tok, engine_for=lambda _: engine, config=ProxyConfig(), log_path=str(log_path)
    )
    return proxy, engine


def _log_audit(log_path: Path, eid: str) -> dict:
    try:
        log = read_log(log_path)
    except Exception as exc:  # noqa: BLE001 - an unreadable log is the finding
        return {"log_readable": False, "log_error": f"{type(exc).__name__}: {exc}"[:300]}
    records = log.for_execution(eid)
    return {
        "log_readable": True,
        "records": len(records),
        "torn_bytes": log.torn_bytes,
        "unresolved": log.unresolved,
        "closed_in_log": eid in log.summaries,
        "finish_reasons": dict(Counter(r.finish_reason for r in records)),
        "same_prompt_records": sum(
            c - 1
            for c in Counter(
                (r.parent_call_id, r.shared_len, tuple(r.prompt_tail)) for r in records
            ).values()
        ),
    }


def disk_full(root: Path) -> dict:
    """A 64 KiB tmpfs holds the call log, filled but for ~6 KiB; an agent makes chained calls
    until the log cannot be written, tries 3 more, then space is freed, it retries its failed call
    and goes on for 5 more; the execution is closed."""
    subprocess.run(["umount", str(root / "mnt")], capture_output=True)
    subprocess.run(["rm", "-rf", str(root)], check=True)
    mnt = root / "mnt"
    mnt.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        return {
            "fault": "disk full under the call log",
            "injected": False,
            "what_happened": f"cannot mount a tmpfs: {mounted.stderr.strip()[:200]}",
        }
    try:
        return anyio.run(_disk_full, mnt, backend="trio")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


async def _disk_full(mnt: Path) -> dict:
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - 6 * 1024))
    log_path = mnt / "calls.log"
    proxy, _ = _proxy(log_path)
    eid = "disk-full-0"
    key = proxy.mint_key(eid)
    statuses, received, errors = [], 0, []
    messages = [{"role": "user", "content": "Write the word pearl to the file out.txt."}]

    async def call(http) -> bool:
        nonlocal received
        r = await http.post(
            "/chat/completions",
            json={"model": "gyre", "max_tokens": 16, "messages": messages},
            headers={"Authorization": f"Bearer {key}"},
        )
        statuses.append(r.status_code)
        if r.status_code != 200:
            errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
            return False
        received += 1
        messages.extend(
            [
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": "go on with the next line"},
            ]
        )
        return True

    close_error = None
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=60) as http:
            failed_at = None
            for i in range(200):
                if not await call(http):
                    failed_at = i
                    break
            for _ in range(3):
                await call(http)
            filler.unlink()  # the operator frees space
            retried_ok = await call(http)
            for _ in range(5):
                await call(http)
        try:
            await proxy.close(eid)
        except Exception as exc:  # noqa: BLE001 - recorded
            close_error = f"{type(exc).__name__}: {exc}"[:300]
        tg.cancel_scope.cancel()
    proxy.log.close()
    audit = _log_audit(log_path, eid)
    lost = max(0, received - audit.get("records", 0)) if audit["log_readable"] else received
    extra = max(0, audit.get("records", 0) - received)
    return {
        "fault": "disk full under the call log (64 KiB tmpfs)",
        "layer": "proxy over Hypercorn + scripted engine, in-process",
        "injected": failed_at is not None,
        "calls_ok_before_full": failed_at,
        "replies_received": received,
        "http_statuses": dict(Counter(statuses)),
        "error_samples": errors[:3],
        "retry_after_space_freed_ok": retried_ok,
        "close_error": close_error,
        **audit,
        "records_missing_for_received_replies": lost,
        "executions_lost": 0 if audit["log_readable"] and lost == 0 else 1,
        "calls_duplicated": extra,
        "steps_lost": 0,
        "what_happened": (
            f"{failed_at} calls recorded, then the log write failed: "
            f"{errors[0] if errors else 'no error'}; after freeing space the retry "
            f"{'succeeded' if retried_ok else 'failed'}; log readable: "
            f"{audit['log_readable']}"
        ),
    }


def stream_drop(root: Path) -> dict:
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir(parents=True)
    return anyio.run(_stream_drop, root, backend="trio")


async def _stream_drop(root: Path) -> dict:
    """A streamed call (40 tokens, 50 ms each) whose client closes the connection after the first
    content chunk, then retries it (the SDK's way) to the end: without and with an
    Idempotency-Key. What the client received is compared with the call log."""
    log_path = root / "calls.log"
    proxy, engine = _proxy(log_path, token_delay_s=0.05, reply_tokens=40)
    variants = {}
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=60) as http:
            for variant, idem in (("no_key", None), ("idempotency_key", "retry-1")):
                eid = f"drop-{variant}"
                key = proxy.mint_key(eid)
                headers = {"Authorization": f"Bearer {key}"}
                if idem:
                    headers["Idempotency-Key"] = idem
                body = {
                    "model": "gyre",
                    "max_tokens": 64,
                    "stream": True,
                    "messages": [{"role": "user", "content": "Write the word pearl."}],
                }
                chunks = 0
                async with http.stream(
                    "POST", "/chat/completions", json=body, headers=headers
                ) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data:") and '"content"' in line:
                            chunks += 1
                            if chunks >= 2:
                                break  # leaving the block closes the connection mid-stream
                await anyio.sleep(1.0)
                aborted_before = engine.statistics().requests_aborted
                full = ""
                async with http.stream(
                    "POST", "/chat/completions", json=body, headers=headers
                ) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data:") and "[DONE]" not in line:
                            full += line
                await proxy.close(eid)
                variants[variant] = {
                    "chunks_before_drop": chunks,
                    "engine_aborts_after_drop": aborted_before,
                    "retry_complete": '"finish_reason":"stop"' in full
                    or '"finish_reason": "stop"' in full,
                }
        tg.cancel_scope.cancel()
    proxy.log.close()
    for variant in variants:
        variants[variant].update(_log_audit(log_path, f"drop-{variant}"))
    stats = proxy.statistics()
    # One logical call per variant reached its client whole; every record beyond it carries
    # tokens of the same request: trained as a second branch of the same prompt.
    dup = sum(max(0, v.get("records", 0) - 1) for v in variants.values())
    return {
        "fault": "proxy connection dropped mid-stream, then the client retries",
        "layer": "proxy over Hypercorn + scripted engine (50 ms a token), in-process",
        "injected": all(v["chunks_before_drop"] >= 1 for v in variants.values()),
        "variants": variants,
        "disconnect_aborts": stats.disconnect_aborts,
        "retries_joined": stats.retries_joined,
        "executions_lost": 0,
        "calls_duplicated": dup,
        "steps_lost": 0,
        "what_happened": "; ".join(
            f"{k}: {v.get('records')} records ({v.get('finish_reasons')}), engine aborted "
            f"{v['engine_aborts_after_drop']} so far, retry complete {v['retry_complete']}"
            for k, v in variants.items()
        ),
    }
