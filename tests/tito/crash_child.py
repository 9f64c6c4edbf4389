"""A proxy with agents streaming calls into it, for the crash test: killed with SIGKILL mid-run.

Prints one JSON line per completed response: {"execution", "call_id", "completion_ids"}.
Usage: python -m tests.tito.crash_child LOG_PATH
"""

from __future__ import annotations

import json
import sys

import anyio
import httpx

from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine
from gyre.model.recipe import build_tokenizer
from gyre.tito.proxy import TitoProxy


async def agent(base: str, key: str, execution: str) -> None:
    messages = [{"role": "user", "content": f"work on {execution}"}]
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        while True:
            body = {"model": "gyre", "messages": messages, "stream": True, "seed": len(messages)}
            content, ids, call_id = "", [], None
            async with http.stream(
                "POST", "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        break
                    if line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        call_id = chunk["id"].split("/")[-1]
                        for ch in chunk["choices"]:
                            ids += ch["token_ids"]
                            content += ch["delta"].get("content") or ""
            print(
                json.dumps({"execution": execution, "call_id": call_id, "completion_ids": ids}),
                flush=True,
            )
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": "go on"},
            ]


async def main(log_path: str) -> None:
    tok = build_tokenizer()
    engine = ScriptedEngine(
        eos_token_id=tok.eos_token_id, token_delay_s=0.002, max_model_len=1 << 20
    )
    proxy = TitoProxy(
        tokenizer=tok,
        engine_for=lambda _: engine,
        config=ProxyConfig(flush_interval_s=60),
        log_path=log_path,
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        for i in range(4):
            tg.start_soon(agent, f"http://127.0.0.1:{port}/v1", proxy.mint_key(f"ex{i}"), f"ex{i}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], backend="trio")
