"""`python -m benchmarks.engine_host`: gyre's cell process with two benchmark routes added.

It runs `gyre.cell.server`'s own `main` (same arguments, start-up and serving) with
`POST /bench/direct` added to the cell's aiohttp app: that route times batches sent straight to the
cell engine's vLLM `AsyncLLM`, in this process, as a program using vLLM directly would. So
`bench_engine` times the direct path and the path through the cell on one engine start, batch by
batch in turn: how fast an engine start happens to run (direct alone: 0.128-0.194 s a request of 64
tokens across starts on 2 cores, 2026-12-06) no longer lands in the ratio.

`POST /bench/direct` body: {"prompts": [[token IDs]], "max_tokens": int, "tag": str}; answer:
{"seconds": float (the batch's wall time), "cpu_s": float (this process's CPU seconds during it)}.
Every request decodes exactly `max_tokens` tokens with the sampled token's logprob, as flat
logprobs (what gyre asks of vLLM: `gyre.engines.vllm_params`). Bearer-checked like the cell's
other routes.

`POST /bench/vllm_app` (no body) starts, once, vLLM's OpenAI server on this cell's engine
(`vllm_openai_server`) and answers {"port": int, "model": str (the name it serves)}; 500 with
the error when it cannot start. So `bench_engine` times gyre's proxy and vLLM's server on one
engine start too.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

import anyio
from aiohttp import web

import gyre.cell.server as cell
from gyre._asgi import listening_socket
from gyre.cell.api import CellAPI, cell_app
from gyre.engines.vllm_params import sampled_logprobs

__all__ = ["direct_batch", "main", "vllm_openai_server"]


async def direct_batch(llm, prompts: list[list[int]], max_tokens: int, tag: str) -> int:
    """Run `prompts` concurrently on vLLM's `AsyncLLM` `llm` (token prompts, DELTA outputs, the
    sampled token's logprob as flat logprobs, no detokenization, EOS ignored); returns the tokens
    decoded."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0,
        seed=0,
        ignore_eos=True,
        logprobs=0,
        flat_logprobs=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    total = 0

    async def one(i: int, ids: list[int]) -> None:
        nonlocal total
        async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, f"{tag}-{i}"):
            c = out.outputs[0]
            total += len(sampled_logprobs(c.logprobs, list(c.token_ids)))

    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):
            tg.start_soon(one, i, ids)
    return total


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def vllm_openai_server(llm, sock: socket.socket):
    """vLLM's own OpenAI server as `vllm serve` builds and serves it (`build_app`,
    `init_app_state`, its lifespan, which freezes the heap, and its `NoSignalServer`: uvicorn
    without signal handlers, so the cell's stay) on this cell's `AsyncLLM` `llm`, for the
    listening socket `sock`. Its model name is the model folder's path. It runs on the cell's
    asyncio loop (`vllm serve`: uvloop). Returns the uvicorn server, not yet serving: `serve`
    it in a task and wait for `started`. Raises what vLLM raises when its app cannot be built
    (an argument its parser refuses, an engine that does not answer `get_supported_tasks`)."""
    import uvicorn
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.launcher import NoSignalServer
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", llm.model_config.model, "--disable-log-stats", "--disable-uvicorn-access-log"]
    )
    tasks = await llm.get_supported_tasks()
    app = build_app(args, tasks, llm.model_config)
    await init_app_state(llm, app.state, args, tasks)
    return NoSignalServer(uvicorn.Config(app, log_level="warning", access_log=False))


async def _serving(server, sock: socket.socket) -> None:
    """`server.serve` on `sock`; uvicorn's `sys.exit` on a failed start becomes an error of this
    task instead of leaving the cell's event loop."""
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:
        raise RuntimeError(f"uvicorn exited with {exc.code}") from None


def _app_with_direct(api: CellAPI) -> web.Application:
    app = cell_app(api)
    hosted: dict = {}  # vLLM's server on this cell's engine, once started: task, server, port
    starting = asyncio.Lock()

    async def direct(request: web.Request) -> web.Response:
        body = await request.json()
        max_tokens = body["max_tokens"]
        cpu0, t0 = _cpu_s(), time.perf_counter()
        tokens = await direct_batch(api.engine.llm, body["prompts"], max_tokens, body["tag"])
        seconds, cpu_s = time.perf_counter() - t0, _cpu_s() - cpu0
        expected = len(body["prompts"]) * max_tokens
        if tokens != expected:
            return web.Response(status=500, text=f"decoded {tokens} tokens, not {expected}")
        return web.json_response({"seconds": seconds, "cpu_s": cpu_s})

    async def vllm_app(request: web.Request) -> web.Response:
        async with starting:
            if not hosted:
                sock = listening_socket("127.0.0.1", 0)
                try:
                    server = await vllm_openai_server(api.engine.llm, sock)
                    task = asyncio.create_task(_serving(server, sock))
                    while not server.started and not task.done():
                        await asyncio.sleep(0.05)
                    if task.done():  # uvicorn's start failed (it exits the task)
                        raise RuntimeError(f"uvicorn did not start: {task.exception()!r}")
                except Exception as exc:
                    sock.close()
                    return web.Response(status=500, text=f"{type(exc).__name__}: {exc}")
                hosted.update(task=task, server=server, port=sock.getsockname()[1])
        model = api.engine.llm.model_config.model
        return web.json_response({"port": hosted["port"], "model": model})

    async def stop_vllm_app(_app: web.Application) -> None:
        if hosted:
            task = hosted["task"]
            hosted["server"].should_exit = True  # uvicorn's own shutdown, its lifespan's end
            await asyncio.wait([task], timeout=10)  # an error must not stop the cell's shutdown
            if not task.done():
                task.cancel()
                await asyncio.wait([task])
            if not task.cancelled() and task.exception() is not None:
                print(f"vLLM's app ended with {task.exception()!r}", file=sys.stderr)
            hosted.clear()  # its references to the engine go before the engine's shutdown

    app.router.add_post("/bench/direct", direct)
    app.router.add_post("/bench/vllm_app", vllm_app)
    app.on_cleanup.append(stop_vllm_app)
    return app


def main(argv: list[str] | None = None) -> int:
    return cell.main(argv, app_factory=_app_with_direct)


if __name__ == "__main__":
    sys.exit(main())
