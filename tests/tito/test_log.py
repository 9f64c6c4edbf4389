"""The call log: records round-trip, a torn tail is skipped, a killed proxy loses no completed
call."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import httpx
import msgspec
import pytest

from gyre.engines.scripted import ScriptedEngine
from gyre.tito.log import LogCorruptError, read_log
from gyre.tito.records import ExecutionTokens, ModelCall
from tests.tito.conftest import make_proxy, serving

ROOT = Path(__file__).resolve().parents[2]


async def run_conversation(tok, log_path: Path, turns: int = 6) -> list[ModelCall]:
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine, log_path=str(log_path))
    key = proxy.mint_key("ex")
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        msgs = [{"role": "user", "content": "start"}]
        for k in range(turns):
            r = (
                await http.post(
                    "/chat/completions",
                    json={"model": "gyre", "messages": msgs, "seed": k, "n": 1 + k % 2},
                    headers={"Authorization": f"Bearer {key}"},
                )
            ).json()
            msgs += [r["choices"][-1]["message"], {"role": "user", "content": f"next {k}"}]
        calls = proxy.calls("ex")
        await proxy.close("ex")
    stats = proxy.log.statistics()
    assert (
        stats.frames_written == len(calls) + 1 and stats.syncs >= 1
    )  # closing an execution fsyncs
    assert stats.bytes_written == log_path.stat().st_size
    proxy.log.close()
    return calls


@pytest.mark.anyio
async def test_log_round_trips_every_call_and_summary(tok, tmp_path, anyio_backend):
    path = tmp_path / "calls.log"
    calls = await run_conversation(tok, path)
    got = read_log(path)
    assert got.calls == calls and got.torn_bytes == 0 and got.unresolved == 0
    assert path.stat().st_size > 0
    assert got.summaries["ex"].num_calls == len(calls) == 9
    # The log stores new tokens only: far smaller than every prompt in full.
    full = sum(len(msgspec.msgpack.encode(c)) for c in ExecutionTokens(calls).full_calls())
    assert path.stat().st_size < full
    # Each record holds only the tokens after its parent's prompt + completion.
    tokens = ExecutionTokens(got.calls)
    for c in got.calls[1:]:
        parent = tokens[c.parent_call_id]
        assert c.shared_len == parent.prompt_len + len(parent.completion_ids)
        head = tokens.sequence(c.parent_call_id)
        assert tokens.prompt_ids(c.call_id) == head + c.prompt_tail


@pytest.mark.anyio
async def test_torn_last_frame_is_skipped_and_corruption_detected(tok, tmp_path, anyio_backend):
    path = tmp_path / "calls.log"
    calls = await run_conversation(tok, path)
    data = path.read_bytes()
    for cut in (1, 7, 40):  # inside the last frame (the execution summary)
        path.write_bytes(data[:-cut])
        got = read_log(path)
        assert got.calls == calls and got.torn_bytes > 0 and "ex" not in got.summaries
    path.write_bytes(data + b"\x10\x00\x00\x00garbage")  # a torn header + partial payload
    got = read_log(path)
    assert got.calls == calls and got.torn_bytes == 11 and "ex" in got.summaries
    flipped = bytearray(data)
    flipped[20] ^= 0xFF  # inside the first frame, with frames after it
    path.write_bytes(bytes(flipped))
    with pytest.raises(LogCorruptError):
        read_log(path)


def test_killed_proxy_loses_no_completed_call(tmp_path):
    path = tmp_path / "calls.log"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.tito.crash_child", str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    done = []
    try:
        for line in child.stdout:
            done.append(json.loads(line))
            if len(done) >= 40:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)  # while the 4 agents have calls streaming
        child.wait(timeout=30)
    assert len(done) >= 40
    got = read_log(path)
    recorded = {(c.execution_id, c.call_id): c.completion_ids for c in got.calls}
    for d in done:
        assert recorded[(d["execution"], d["call_id"])] == d["completion_ids"]
    # Rebuilt prompts chain: each call extends its parent's prompt + completion.
    by_execution: dict[str, list[ModelCall]] = {}
    for c in got.calls:
        by_execution.setdefault(c.execution_id, []).append(c)
    for calls in by_execution.values():
        full = {c.call_id: c for c in ExecutionTokens(calls).full_calls()}
        for c in full.values():
            if c.parent_call_id is not None and c.divergence is None:
                p = full[c.parent_call_id]
                assert (
                    c.prompt_ids[: len(p.prompt_ids) + len(p.completion_ids)]
                    == p.prompt_ids + p.completion_ids
                )


@pytest.mark.anyio
async def test_proxy_for_run_logs_under_the_run_dir(tok, tmp_path, anyio_backend):
    from gyre.config import RunConfig
    from gyre.tito import TitoProxy

    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)
    proxy = TitoProxy.for_run(
        RunConfig(run_dir=str(tmp_path / "run")), tokenizer=tok, engine_for=lambda _: engine
    )
    key = proxy.mint_key("e")
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        r = await http.post(
            "/chat/completions",
            json={"model": "gyre", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200
    summary = await proxy.close("e")
    proxy.log.close()
    got = read_log(tmp_path / "run" / "calls.log")
    assert [c.call_id for c in got.calls] == ["c0"] and got.summaries["e"] == summary


@pytest.mark.anyio
async def test_branches_off_one_call_keep_every_prompt_exact(tok, tmp_path, anyio_backend):
    """A linear conversation appends to one list in place; a branch copies; no view is corrupted."""
    from gyre.engines.scripted import ScriptedReply
    from tests.tito.conftest import encode

    def readable(request, index, vocab_size):  # text that survives decode + re-render
        return ScriptedReply(token_ids=encode(tok, f"answer {len(request.prompt_ids)}"))

    engine = ScriptedEngine(rule=readable, eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine, log_path=str(tmp_path / "calls.log"))
    key = proxy.mint_key("br")
    headers = {"Authorization": f"Bearer {key}"}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:

        async def ask(msgs):
            r = await http.post(
                "/chat/completions",
                json={"model": "gyre", "messages": msgs, "seed": len(msgs)},
                headers=headers,
            )
            return r.json()["choices"][0]["message"]

        root = [{"role": "user", "content": "start"}]
        m0 = await ask(root)
        a = root + [m0, {"role": "user", "content": "branch a"}]
        ma = await ask(a)  # extends c0's list in place
        b = root + [m0, {"role": "user", "content": "branch b"}]
        await ask(b)  # c0's list is taken: a copy
        await ask(a + [ma, {"role": "user", "content": "deeper a"}])  # extends branch a in place
        refs = proxy.calls("br")
        calls = proxy.calls("br", full=True)
        await proxy.close("br")
    proxy.log.close()
    assert [c.parent_call_id for c in calls] == [None, "c0", "c0", "c1"]
    assert all(c.divergence is None for c in calls)
    texts = [proxy.text.decode(c.prompt_ids) for c in calls]
    for msgs, text in zip([root, a, b], texts):
        assert text == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    for child, parent in ((calls[1], calls[0]), (calls[2], calls[0]), (calls[3], calls[1])):
        n = len(parent.prompt_ids) + len(parent.completion_ids)
        assert child.prompt_ids[:n] == parent.prompt_ids + parent.completion_ids
    assert read_log(tmp_path / "calls.log").calls == refs
    assert ExecutionTokens(refs).full_calls() == calls


_FULL_DISK_CHILD = """
import json, resource, signal, sys
import anyio
from gyre.errors import ProxyError
from gyre.tito.log import CallLog
from gyre.tito.records import ModelCall

def call(i):
    return ModelCall(execution_id="ex", call_id=f"c{i}", role="main", prompt_tail=[5] * 40,
                     completion_ids=[7, 8], logprobs=[-0.5, -0.5], versions=[0, 0],
                     finish_reason="stop")

async def main():
    log = CallLog(sys.argv[1])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: write fails, no signal
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))  # the disk fills at 1000 bytes
    written, errors = 0, []
    for i in range(40):
        try:
            await log.append_call(call(i))
            written += 1
        except ProxyError as exc:
            errors.append((exc.http_status, str(exc)))
            break
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space is back
    await log.append_call(call(99))
    log.close()
    print(json.dumps({"written": written + 1, "errors": errors}))

anyio.run(main)
"""


def test_a_write_that_fails_on_a_full_disk_leaves_the_log_whole(tmp_path):
    """Disk full under the call log (benchmarks/bench_faults.py): the failing write is cut back,
    a clear 503 is raised, and the frames written after space comes back are readable."""
    path = tmp_path / "calls.log"
    child = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    result = json.loads(child.stdout)
    assert len(result["errors"]) == 1
    status, message = result["errors"][0]
    assert status == 503 and "cannot be written" in message and str(path) in message
    got = read_log(path)  # before the fix: LogCorruptError behind the partial frame
    assert got.torn_bytes == 0
    assert [c.call_id for c in got.calls][-1] == "c99" and len(got.calls) == result["written"]


def _legacy_frame(entry: dict) -> bytes:
    """A frame as gyre wrote it before the reference form (tag `call`, whole `prompt_ids` or
    `prompt_base` + the tokens after the base's prompt + completion), encoded by hand."""
    payload = msgspec.msgpack.encode(entry)
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def _legacy_call(eid, cid, prompt, completion, parent=None, base=None, divergence=None) -> dict:
    call = {
        "execution_id": eid,
        "call_id": cid,
        "role": "main",
        "prompt_ids": prompt,
        "completion_ids": completion,
        "logprobs": [-0.25] * len(completion),
        "versions": [3] * len(completion),
        "finish_reason": "stop",
        "parent_call_id": parent,
        "divergence": divergence,
    }
    return {"type": "call", "call": call, "prompt_base": base}


def test_a_log_in_the_old_whole_prompt_format_reads_as_references(tmp_path):
    """Logs written before the reference form still read: whole prompts and `prompt_base`
    frames become `shared_len` + `prompt_tail`, rebuilding the same prompts."""
    div = {"parent_call_id": "c1", "index": 4, "reason": "compaction"}
    frames = [
        _legacy_call("old", "c0", [1, 2, 3], [4, 5]),
        _legacy_call("old", "c1", [6, 7], [8], parent="c0", base="c0"),  # after c0's 5 tokens
        _legacy_call("old", "c2", [1, 2, 3, 4, 9, 9], [10], parent="c1", divergence=div),
        _legacy_call("other", "c0", [1, 2], [3]),
        _legacy_call("old", "c3", [11], [12], parent="gone", base="gone"),  # base missing
    ]
    path = tmp_path / "calls.log"
    end = {
        "type": "end",
        "summary": {
            "execution_id": "old",
            "num_calls": 3,
            "truncated": False,
            "length_calls": 0,
            "context_refusals": 0,
            "divergences": 1,
            "prompt_tokens": 3 + 7 + 6,
            "completion_tokens": 4,
        },
    }
    path.write_bytes(b"".join(_legacy_frame(f) for f in [*frames, end]))
    got = read_log(path)
    assert got.unresolved == 1 and got.torn_bytes == 0 and got.summaries["old"].prompt_tokens == 16
    old = got.for_execution("old")
    assert [(c.call_id, c.shared_len, c.prompt_tail) for c in old] == [
        ("c0", 0, [1, 2, 3]),
        ("c1", 5, [6, 7]),
        ("c2", 4, [9, 9]),  # the longest prefix shared with c1's [1, 2, 3, 4, 5, 6, 7, 8]
    ]
    tokens = ExecutionTokens(old)
    assert tokens.prompt_ids("c1") == [1, 2, 3, 4, 5, 6, 7]
    assert tokens.prompt_ids("c2") == [1, 2, 3, 4, 9, 9]
    assert tokens.sequence("c2") == [1, 2, 3, 4, 9, 9, 10]
    assert [c.prompt_tail for c in got.for_execution("other")] == [[1, 2]]
    # Only the executions asked for are kept.
    only = read_log(path, executions={"other"})
    assert [c.execution_id for c in only.calls] == ["other"] and only.summaries == {}


def test_read_log_streams_the_file_once_in_bounded_reads(tok, tmp_path, monkeypatch):
    """`read_log` never reads the whole file at once: every read is at most 1 MiB."""
    import gyre.tito.log as log_module

    calls = [
        ModelCall(
            execution_id="big",
            call_id=f"c{i}",
            role="main",
            parent_call_id=None if i == 0 else f"c{i - 1}",
            shared_len=3002 * i,  # all of the parent's prompt + completion
            prompt_tail=[1000 + i] * 3000,
            completion_ids=[1, 2],
            logprobs=[-1.0, -2.0],
            versions=[0, 0],
            finish_reason="stop",
        )
        for i in range(300)
    ]
    from gyre.tito.log import CallEntry, encode_frame

    path = tmp_path / "calls.log"
    path.write_bytes(b"".join(encode_frame(CallEntry(call=c)) for c in calls))
    assert path.stat().st_size > 2 * log_module._READ_BYTES
    sizes: list[int] = []
    real = log_module.io.BufferedReader

    class Counting(real):
        def read(self, n=-1):
            sizes.append(n)
            return super().read(n)

    monkeypatch.setattr(log_module.io, "BufferedReader", Counting)
    got = read_log(path)
    assert got.calls == calls and sizes and max(sizes) <= log_module._READ_BYTES
    want = [1000] * 3000 + [1, 2] + [1001] * 3000 + [1, 2] + [1002] * 3000  # the 3 tails
    assert ExecutionTokens(got.calls).prompt_ids("c2") == want
