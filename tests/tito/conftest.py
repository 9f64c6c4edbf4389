"""Fixtures of the TITO proxy tests: the tiny model's tokenizer, a proxy served on a free port,
requests sent straight to the ASGI app (`asgi_post`: a client that may disconnect)."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from gyre.config import ProxyConfig
from gyre.engines.scripted import ScriptedEngine
from gyre.model.recipe import build_tokenizer
from gyre.tito.proxy import TitoProxy


@pytest.fixture(scope="session")
def tok():
    """The reference tiny model's tokenizer (ChatML, <|im_end|> eos, no BOS)."""
    return build_tokenizer()


class SnapshotEngine(ScriptedEngine):
    """A scripted engine that also copies every prompt when generation starts (`prompts_seen`):
    the proxy appends to a linear conversation's prompt list after each call has finished."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prompts_seen: list[list[int]] = []

    async def generate(self, request):
        self.prompts_seen.append(list(request.prompt_ids))
        async for delta in super().generate(request):
            yield delta


def make_proxy(tok, engine: ScriptedEngine, log_path=None, **config) -> TitoProxy:
    """A proxy over one engine; `config` overrides `ProxyConfig` fields (checks every render)."""
    config.setdefault("render_check_every", 1)
    return TitoProxy(
        tokenizer=tok,
        engine_for=lambda _execution: engine,
        config=ProxyConfig(**config),
        log_path=log_path,
    )


@contextlib.asynccontextmanager
async def serving(proxy: TitoProxy) -> AsyncIterator[str]:
    """Serve `proxy` on a free port in this event loop; yields the `/v1` base URL."""
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.serve)
        yield f"http://127.0.0.1:{port}/v1"
        tg.cancel_scope.cancel()


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def request_scope(path: str, key: str, headers: dict[str, str] | None = None) -> dict:
    raw = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": raw,
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 40000),
    }


async def asgi_post(
    proxy,
    path: str,
    key: str,
    body: dict | bytes,
    *,
    gone_after_s: float = math.inf,
    gone_when: Callable[[], bool] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """POST `body` (JSON-encoded unless bytes) straight to the ASGI app; the client disconnects
    `gone_after_s` after sending it (never: inf), or once `gone_when()` holds (polled every 5 ms:
    for a test that needs tokens sampled first, whatever the machine's load). Returns (status,
    response body: SSE chunks joined)."""
    if gone_when is not None and gone_after_s != math.inf:
        raise ValueError("asgi_post: give gone_after_s or gone_when, not both")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent_body = False
    status, chunks = 0, []

    async def receive():
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        if gone_when is None:
            await anyio.sleep(gone_after_s)
        else:
            while not gone_when():
                await anyio.sleep(0.005)
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            chunks.append(message.get("body", b""))

    await proxy.app(request_scope(path, key, headers), receive, send)
    return status, b"".join(chunks)
