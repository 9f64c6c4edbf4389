"""`python -m benchmarks.proxy_host`: gyre's TITO proxy in a process of its own, in front of a cell.

`bench_engine` compares gyre's proxy plus a cell against vLLM's own OpenAI server. vLLM's server is
a process of its own, and its load client (the benchmark) runs beside it; so does gyre's proxy
here, as in a run, where the node's event loop hosts the proxy and the agents are other processes.
Until 2026-12-06 the proxy ran in the benchmark's own process, so the load client's CPU (httpx:
half of that process's samples with a scripted engine behind the proxy) and the proxy shared one
thread, while vLLM's server had a process to itself.

Runs on trio, like `python -m gyre.node`: a `CellClient` to `--cell-url` (the cell secret from
`$GYRE_CELL_SECRET`, as the cells get it), a `TitoProxy` with the model's tokenizer and no stop
token IDs (every call decodes exactly `max_tokens`, like `ignore_eos` on vLLM's server), and
`--keys` minted API keys. Once serving, it writes `{"port": int, "model": str, "keys": [str]}`
to `--port-file` (atomically) and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import anyio
import msgspec

from gyre._heap import freeze_startup_heap
from gyre.cell.client import CellClient
from gyre.cell.wire import CELL_SECRET_ENV
from gyre.config import EngineConfig, ProxyConfig

__all__ = ["main", "serve"]


async def serve(cell_url: str, model_dir: Path, config: EngineConfig, keys: int, port_file: Path):
    """Serve the proxy in front of the cell at `cell_url` until SIGTERM or SIGINT."""
    from transformers import AutoTokenizer

    from gyre.tito.proxy import TitoProxy

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    async with CellClient(cell_url, config) as engine:
        proxy = TitoProxy(tokenizer=tokenizer, engine_for=lambda _: engine, config=ProxyConfig())
        proxy.intake.stop_token_ids = ()
        minted = [proxy.mint_key(f"bench-{i}") for i in range(keys)]
        freeze_startup_heap()  # as the node does once its cells are up
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:
                port = await tg.start(proxy.serve)
                tmp = port_file.with_suffix(".tmp")
                tmp.write_text(
                    json.dumps({"port": port, "model": proxy.config.model_name, "keys": minted})
                )
                tmp.replace(port_file)
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell-url", required=True)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--engine-config", required=True, help="EngineConfig as JSON")
    parser.add_argument("--keys", type=int, required=True, help="API keys to mint (>= 1)")
    parser.add_argument("--port-file", required=True, type=Path)
    args = parser.parse_args(argv)
    if not os.environ.get(CELL_SECRET_ENV):
        parser.error(f"${CELL_SECRET_ENV} is not set: the cell refuses requests without it")
    if args.keys < 1:
        parser.error(f"--keys {args.keys} must be >= 1")
    config = msgspec.json.decode(args.engine_config.encode(), type=EngineConfig)
    anyio.run(serve, args.cell_url, args.model, config, args.keys, args.port_file, backend="trio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
