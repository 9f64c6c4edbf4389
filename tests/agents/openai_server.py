"""A scripted OpenAI-compatible server for tests: replays assistant messages chosen by a policy.

Owns `ScriptedOpenAI` (a `ThreadingHTTPServer` on 127.0.0.1, port 0, serving
`POST /v1/chat/completions` without streaming), `Call` (what a request carried) and `HANG` (a
policy answer that holds the request open until the server closes, like a model that never
returns). Policies are registered per API key and see the role header and messages; the server
knows nothing about tasks. Stands in for the TITO proxy until that is ready.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gyre.agents.tools import tool_call_message

__all__ = ["ScriptedOpenAI", "Call", "HANG", "tool_call_message"]

HANG = object()


@dataclass
class Call:
    api_key: str
    role: str | None
    messages: list[dict]
    tools: list[dict] | None
    reply: dict | None = None


Policy = Callable[[Call], "dict | object"]


@dataclass
class ScriptedOpenAI:
    policies: dict[str, Policy] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    on_call: Callable[[str, int], None] | None = None
    """Called (api_key, completion tokens) after each answered call, from the server thread."""

    def __post_init__(self) -> None:
        self._closed = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                key = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                call = Call(
                    api_key=key,
                    role=self.headers.get("X-Gyre-Role"),
                    messages=body.get("messages", []),
                    tools=body.get("tools"),
                )
                with server._lock:
                    server.calls.append(call)
                policy = server.policies.get(key)
                if policy is None or not self.path.endswith("/chat/completions"):
                    return self._send(
                        401 if policy is None else 404,
                        {
                            "error": {
                                "message": f"unknown key or path {self.path}",
                                "type": "invalid_request_error",
                            }
                        },
                    )
                reply = policy(call)
                if reply is HANG:
                    server._closed.wait(600)
                    return
                call.reply = reply
                tokens = len(json.dumps(reply)) // 4
                if server.on_call is not None:
                    server.on_call(key, tokens)
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(server.calls)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "scripted"),
                        "choices": [
                            {
                                "index": 0,
                                "message": reply,
                                "finish_reason": "tool_calls"
                                if reply.get("tool_calls")
                                else "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": 1,
                            "completion_tokens": tokens,
                            "total_tokens": tokens + 1,
                        },
                    },
                )

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def register(self, api_key: str, policy: Policy) -> None:
        self.policies[api_key] = policy

    def calls_for(self, api_key: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.api_key == api_key]

    def calls_for_execution(self, execution_id: str) -> list[Call]:
        """Calls made with keys minted for `execution_id` (`gyre-<id>-<random>`)."""
        with self._lock:
            return [c for c in self.calls if c.api_key.rsplit("-", 1)[0] == f"gyre-{execution_id}"]

    def close(self) -> None:
        self._closed.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class ControlBridge:
    """Feeds the server's calls into `ExecutionControl`s on the event loop, as the proxy will.

    `attach(server)` once; `register(api_key, control)` from the event loop thread."""

    def __init__(self) -> None:
        self._controls: dict[str, tuple[object, object]] = {}

    def attach(self, server: ScriptedOpenAI) -> None:
        server.on_call = self._on_call

    def register(self, api_key: str, control) -> None:
        import anyio.lowlevel

        self._controls[api_key] = (control, anyio.lowlevel.current_token())

    def _on_call(self, api_key: str, tokens: int) -> None:
        import anyio.from_thread

        entry = self._controls.get(api_key)
        if entry is not None:
            control, token = entry
            anyio.from_thread.run_sync(control.note_model_call, tokens, token=token)
