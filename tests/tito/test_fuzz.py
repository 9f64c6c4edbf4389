"""Property tests of the request schema of /v1/chat/completions and /v1/completions (issue 18).

Random and ill-typed JSON bodies (and bytes that are not JSON) against the ASGI app with the
scripted engine: never a 5xx, every refusal a 4xx in OpenAI's error shape
(`{"error": {"message", "type", "param", "code"}}`), and a good request is served afterwards.
Derandomized, so the same 200 bodies run every time.
"""

from __future__ import annotations

import json
import sys
from urllib.parse import quote, unquote

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.engines.scripted import ScriptedEngine
from tests.tito.conftest import asgi_post, make_proxy

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()  # NaN and infinities are sent as JSON's NaN / Infinity extensions
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
small_ints = st.integers(min_value=-3, max_value=40)
texts = st.text(max_size=20)
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | texts
content = (
    st.none()
    | texts
    | st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url"]) | texts},
            optional={"text": texts | json_values},
        ),
        max_size=3,
    )
)
tool_call = st.fixed_dictionaries(
    {
        "function": st.fixed_dictionaries(
            {"name": texts}, optional={"arguments": texts | json_values}
        )
    },
    optional={"id": texts, "type": texts},
)
message = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": content | json_values,
        "tool_calls": st.lists(tool_call, max_size=2),
        "tool_call_id": texts,
        "name": texts,
        "reasoning_content": texts,
    },
)
sampling = {
    "n": small_ints | json_values,
    "max_tokens": small_ints | json_values,
    "temperature": st.floats(-1, 3) | json_values,
    "top_p": st.floats(-0.5, 1.5) | json_values,
    "top_k": small_ints,
    "seed": st.integers(-(2**65), 2**65),
    "stop": texts | st.lists(texts, max_size=20) | json_values,
    "stop_token_ids": st.lists(st.integers(-5, 5000), max_size=3) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()})
    | json_values,
    "return_token_ids": st.booleans(),
}
chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.just("gyre") | json_values,
        "messages": st.lists(message, max_size=4) | json_values,
        "tools": st.lists(json_values, max_size=2),
        "tool_choice": st.sampled_from(["auto", "none"]) | json_values,
        "max_completion_tokens": small_ints | json_values,
        "logprobs": st.booleans() | json_values,
        "top_logprobs": small_ints,
        "add_generation_prompt": st.booleans() | json_values,
        "chat_template_kwargs": st.dictionaries(texts, json_values, max_size=3) | json_values,
        **sampling,
    },
)
completion_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.just("gyre") | json_values,
        "prompt": texts | st.lists(st.integers(-5, 5000), max_size=6) | json_values,
        "logprobs": small_ints | json_values,
        "echo": st.booleans(),
        **sampling,
    },
)


valid_sampling = {
    "n": st.integers(1, 3),
    "max_tokens": st.integers(1, 40),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(0, 50),
    "seed": st.integers(0, 2**31),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "stream": st.booleans(),
    "return_token_ids": st.booleans(),
}
valid_chat = st.fixed_dictionaries(
    {
        "model": st.just("gyre"),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}
            ),
            min_size=1,
            max_size=3,
        ),
    },
    optional={"logprobs": st.booleans(), **valid_sampling},
)
valid_completion = st.fixed_dictionaries(
    {
        "model": st.just("gyre"),
        "prompt": st.text(min_size=1, max_size=20)
        | st.lists(st.integers(0, 999), min_size=1, max_size=6),
    },
    optional={"logprobs": st.integers(0, 3), **valid_sampling},
)


def one_field_wrong(valid: st.SearchStrategy, fields: list[str]) -> st.SearchStrategy[dict]:
    """A valid body with one field set to any JSON value (or removed)."""
    return st.builds(
        lambda body, field, value, drop: (
            {k: v for k, v in body.items() if k != field} if drop else {**body, field: value}
        ),
        valid,
        st.sampled_from(fields),
        json_values,
        st.booleans(),
    )


def bodies(
    valid: st.SearchStrategy, structured: st.SearchStrategy, fields: list[str]
) -> st.SearchStrategy[bytes]:
    """Valid bodies, valid ones with one of `fields` wrong, near-schema JSON, any JSON value, and
    bytes that are not JSON."""
    dicts = valid | one_field_wrong(valid, fields) | structured
    return (
        st.builds(lambda v: json.dumps(v).encode(), dicts)
        | st.builds(lambda v: json.dumps(v).encode(), json_values)
        | st.binary(max_size=40)
    )


def check_answer(status: int, payload: bytes) -> None:
    assert status < 500, (status, payload[:400])
    if status >= 400:
        assert 400 <= status < 500, status
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"], error
        assert isinstance(error["type"], str) and error["type"], error
        assert error["param"] is None or isinstance(error["param"], str), error
        assert error["code"] is None or isinstance(error["code"], str), error
    else:
        assert status == 200, status


def fuzz(
    tok,
    path: str,
    valid: st.SearchStrategy,
    structured: st.SearchStrategy,
    fields: list[str],
    good: dict,
) -> None:
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key = proxy.mint_key("fuzz")
    statuses = []

    @FUZZ
    @given(body=bodies(valid, structured, fields))
    def one(body: bytes) -> None:
        status, payload = anyio.run(asgi_post, proxy, path, key, body)
        check_answer(status, payload)
        statuses.append(status)

    one()
    assert any(s == 200 for s in statuses) and any(400 <= s < 500 for s in statuses)
    status, payload = anyio.run(asgi_post, proxy, path, key, good)
    assert status == 200, payload
    stats = proxy.statistics()
    assert stats.in_flight == 0 and stats.requests_refused == sum(s >= 400 for s in statuses)


def test_chat_completions_request_schema_fuzz(tok):
    good = {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}
    fields = [
        "model",
        "messages",
        "tools",
        "tool_choice",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "add_generation_prompt",
        "chat_template_kwargs",
        *sampling,
    ]
    fuzz(tok, "/v1/chat/completions", valid_chat, chat_bodies, fields, good)


def test_completions_request_schema_fuzz(tok):
    fields = ["model", "prompt", "logprobs", "echo", *sampling]
    good = {"model": "gyre", "prompt": "hi"}
    fuzz(tok, "/v1/completions", valid_completion, completion_bodies, fields, good)


def test_headers_and_the_calls_listing_fuzz(tok):
    """X-Gyre-Role, X-Gyre-Execution and Idempotency-Key of any text, and any execution ID in
    the calls listing: answered or refused in OpenAI's shape, never a 5xx."""
    proxy = make_proxy(tok, ScriptedEngine(eos_token_id=tok.eos_token_id))
    key = proxy.mint_key("fuzz")
    header_text = st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=12)
    headers = st.fixed_dictionaries(
        {},
        optional={
            "X-Gyre-Role": header_text | st.sampled_from(["main", "sub_agent"]),
            "X-Gyre-Execution": header_text | st.just("fuzz"),
            "Idempotency-Key": header_text,
        },
    )
    good = {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}

    @FUZZ
    @given(headers=headers, execution=header_text | st.just("fuzz"), chat=st.booleans())
    def one(headers: dict, execution: str, chat: bool) -> None:
        if chat:
            status, payload = anyio.run(
                lambda: asgi_post(proxy, "/v1/chat/completions", key, good, headers=headers)
            )
        else:
            status, payload = anyio.run(list_calls, proxy, key, execution)
        check_answer(status, payload)

    one()
    assert anyio.run(asgi_post, proxy, "/v1/chat/completions", key, good)[0] == 200


async def list_calls(proxy, key: str, execution: str) -> tuple[int, bytes]:
    path = "/gyre/v1/executions/" + quote(execution, safe="") + "/calls"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {key}".encode())],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 40000),
    }
    status, chunks = 0, []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            chunks.append(message.get("body", b""))

    await proxy.app(scope, receive, send)
    return status, b"".join(chunks)


def test_json_nested_past_the_decoders_recursion_is_a_400_on_every_route(tok):
    """A valid JSON body nested 1000 and 5000 levels deep (msgspec's decoder raises
    RecursionError past about 1000) is a 400 on each chat-like route, in that API's error shape,
    and the proxy serves a good request after (was a plain-text 500). Python's default recursion
    limit (1000) is pinned: a library loaded earlier in the session may raise it, and then 1000
    levels decode (a whole-suite failure)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        check_deep_bodies(tok)
    finally:
        sys.setrecursionlimit(limit)


def check_deep_bodies(tok) -> None:
    proxy = make_proxy(tok, ScriptedEngine(eos_token_id=tok.eos_token_id))
    key = proxy.mint_key("deep")
    for depth in (1000, 5000):
        deep = b"[" * depth + b"]" * depth
        for path, head in (
            ("/v1/chat/completions", b'{"model":"gyre","messages":[],"vllm_xargs":'),
            ("/v1/completions", b'{"model":"gyre","prompt":"hi","vllm_xargs":'),
            (
                "/v1/responses",
                b'{"model":"gyre","input":"hi","tools":[{"type":"function",'
                b'"name":"f","parameters":{"a":',
            ),
            (
                "/v1/messages",
                b'{"model":"gyre","max_tokens":4,"messages":[],"tools":[{'
                b'"name":"f","input_schema":{"a":',
            ),
        ):
            tail = b"}" if path.endswith("completions") else b"}}]}"
            status, payload = anyio.run(asgi_post, proxy, path, key, head + deep + tail)
            assert status == 400, (path, depth, payload[:200])
            answer = json.loads(payload)
            if path == "/v1/messages":  # Anthropic's shape
                assert answer["type"] == "error", answer
                assert "nested too deeply" in answer["error"]["message"], answer
            else:
                check_answer(status, payload)
                assert "nested too deeply" in answer["error"]["message"], answer
    good = {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}
    assert anyio.run(asgi_post, proxy, "/v1/chat/completions", key, good)[0] == 200
