"""The server side of `bench_soak.py`: the TITO proxy in front of the scripted engine, alone in
its own process, served over Hypercorn on loopback on trio (as the node serves it).

Run by the soak as `python -m benchmarks.soak_server LOG_PATH`; it prints `port <n>` once bound,
then answers one control line at a time on stdin / stdout, as the node's harness would act:
`open <execution_id>` -> `key <api key>`; `close <execution_id>` -> `closed <calls>`;
`stats` -> `stats <ProxyStatistics as JSON>`; `quit` ends it. Knows nothing about load or timing:
the client measures; this process only serves, so its RSS is the proxy's (and the engine's).
"""

from __future__ import annotations

import collections
import sys
import zlib
from pathlib import Path

import anyio
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre.config import ProxyConfig  # noqa: E402
from gyre.engines.scripted import ScriptedEngine, ScriptedReply  # noqa: E402
from gyre.model.recipe import build_tokenizer  # noqa: E402
from gyre.tito.proxy import TitoProxy  # noqa: E402

REPLIES = [
    " the file is read",
    " run the test and check the value",
    " I will write the main path now",
    " the name is in src and the test will pass",
]


async def main(log_path: str) -> None:
    tok = build_tokenizer()
    replies = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in REPLIES]

    def rule(req, index, vocab_size):
        return ScriptedReply(token_ids=replies[zlib.crc32(repr(req.prompt_ids[-8:]).encode()) % 4])

    engine = ScriptedEngine(rule=rule, eos_token_id=tok.eos_token_id, max_model_len=65_536)
    # The fake engine keeps every request for tests to inspect; a soak keeps only the last few.
    engine.requests_seen = collections.deque(maxlen=8)
    proxy = TitoProxy(
        tokenizer=tok, engine_for=lambda _: engine, config=ProxyConfig(), log_path=log_path
    )
    stdin = anyio.wrap_file(sys.stdin)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        print(f"port {port}", flush=True)
        while True:
            line = (await stdin.readline()).split()
            if not line or line[0] == "quit":
                break
            op, arg = line[0], line[1] if len(line) > 1 else ""
            if op == "open":
                print(f"key {proxy.mint_key(arg)}", flush=True)
            elif op == "close":
                summary = await proxy.close(arg)
                print(f"closed {summary.num_calls}", flush=True)
            elif op == "stats":
                stats = msgspec.json.encode(proxy.statistics()).decode()
                print(f"stats {stats}", flush=True)
            else:
                print(f"error unknown op {op!r}", flush=True)
        tg.cancel_scope.cancel()
    proxy.log.close()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], backend="trio")
