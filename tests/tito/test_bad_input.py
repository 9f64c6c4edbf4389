"""Bad input gets a 4xx with an OpenAI-style error body, records nothing, and others keep
working."""

from __future__ import annotations

import json

import anyio
import httpx
import openai
import pytest

from gyre.engines.scripted import ScriptedEngine
from tests.tito.conftest import make_proxy, serving

pytestmark = pytest.mark.anyio

GOOD = {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


async def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(tok, anyio_backend):
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    bad_key, good_key = proxy.mint_key("bad"), proxy.mint_key("good")
    auth = {"Authorization": f"Bearer {bad_key}"}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base, timeout=30) as http:
        err = error_of(
            await http.post(
                "/chat/completions", content=b'{"model": "gyre", "messages": [', headers=auth
            ),
            400,
        )
        assert err["code"] == "invalid_json" and err["type"] == "invalid_request_error"
        err = error_of(
            await http.post(
                "/chat/completions", json={"model": "gyre", "messages": "hi"}, headers=auth
            ),
            400,
        )
        assert err["code"] == "invalid_type" and err["param"] == "messages"
        err = error_of(
            await http.post("/chat/completions", json={**GOOD, "temperature": "hot"}, headers=auth),
            400,
        )
        assert err["param"] == "temperature"
        err = error_of(
            await http.post(
                "/chat/completions", json={**GOOD, "messages": [{"content": "x"}]}, headers=auth
            ),
            400,
        )
        assert "role" in err["message"]
        err = error_of(
            await http.post("/chat/completions", json={**GOOD, "model": "gpt-4o"}, headers=auth),
            404,
        )
        assert err["code"] == "model_not_found"
        err = error_of(
            await http.post("/chat/completions", json={**GOOD, "n": 0}, headers=auth), 400
        )
        assert err["param"] == "n"
        err = error_of(
            await http.post("/chat/completions", json={**GOOD, "max_tokens": 0}, headers=auth), 400
        )
        assert err["param"] == "max_tokens"
        err = error_of(
            await http.post("/chat/completions", json={**GOOD, "messages": []}, headers=auth), 400
        )
        assert err["param"] == "messages"
        err = error_of(
            await http.post(
                "/completions", json={"model": "gyre", "prompt": [1, "x"]}, headers=auth
            ),
            400,
        )
        assert err["param"] == "prompt"
        err = error_of(
            await http.post("/completions", json={"model": "gyre", "prompt": [5000]}, headers=auth),
            400,
        )
        assert err["param"] == "prompt" and err["code"] == "invalid_value"  # out of vocabulary
        huge = (
            b'{"model": "gyre", "messages": [{"role": "user", "content": "'
            + b"x" * (20 * 2**20)
            + b'"}]}'
        )
        err = error_of(await http.post("/chat/completions", content=huge, headers=auth), 413)
        assert err["code"] == "request_too_large"
        err = error_of(
            await http.post(
                "/chat/completions", json=GOOD, headers={"Authorization": "Bearer nope"}
            ),
            401,
        )
        assert err["type"] == "authentication_error"
        error_of(await http.post("/chat/completions", json=GOOD), 401)
        error_of(
            await http.post("/chat/completions", json=GOOD, headers={"X-Gyre-Execution": "nope"}),
            401,
        )
        err = error_of(
            await http.post(
                "/chat/completions", json=GOOD, headers={**auth, "X-Gyre-Role": "boss"}
            ),
            400,
        )
        assert "X-Gyre-Role" in err["message"]
        error_of(await http.get("/nowhere"), 404)
        # Nothing above reached the engine or the records, except the engine-validated prompt.
        assert len(engine.requests_seen) == 0 and proxy.calls("bad") == []

        # Others keep being served, concurrently, through the SDK.
        client = openai.AsyncOpenAI(base_url=base, api_key=good_key, max_retries=0)

        async def one(i: int) -> None:
            r = await client.chat.completions.create(
                model="gyre", messages=[{"role": "user", "content": f"q{i}"}]
            )
            assert r.choices[0].finish_reason == "stop"

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        async with openai.AsyncOpenAI(base_url=base, api_key="wrong", max_retries=0) as wrong:
            with pytest.raises(openai.AuthenticationError):
                await wrong.chat.completions.create(**GOOD)
        await client.close()
        models = (await http.get("/models")).json()
        assert [m["id"] for m in models["data"]] == ["gyre"]
    assert len(proxy.calls("good")) == 8 and proxy.statistics().requests_refused >= 16


async def test_sessions_roles_headers_and_call_listing(tok, anyio_backend):
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine)
    key, other = proxy.mint_key("ex1"), proxy.mint_key("ex2")
    with pytest.raises(ValueError):
        proxy.mint_key("ex1")
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:
        r = await http.post(
            "/chat/completions",
            json=GOOD,
            headers={"Authorization": f"Bearer {key}", "X-Gyre-Role": "sub_agent"},
        )
        assert r.status_code == 200
        r = await http.post(
            "/chat/completions",
            json=GOOD,
            headers={"X-Gyre-Execution": "ex1", "X-Gyre-Role": "main_summary"},
        )
        assert r.status_code == 200
        # A key and an execution header that disagree are refused.
        r = await http.post(
            "/chat/completions",
            json=GOOD,
            headers={"Authorization": f"Bearer {other}", "X-Gyre-Execution": "ex1"},
        )
        assert r.status_code == 401
        listing = (
            await http.get(
                base.removesuffix("/v1") + "/gyre/v1/executions/ex1/calls",
                headers={"Authorization": f"Bearer {key}"},
            )
        ).json()
        assert "data" in listing, listing
        assert [c["role"] for c in listing["data"]] == ["sub_agent", "main_summary"]
        # The listing is in reference form; `?full=1` rebuilds each whole prompt; a bad value
        # of `full` is a 400.
        refs = proxy.calls("ex1")
        assert [(c["shared_len"], c["prompt_tail"]) for c in listing["data"]] == [
            (c.shared_len, c.prompt_tail) for c in refs
        ]
        assert "prompt_ids" not in listing["data"][0]
        full = (
            await http.get(
                base.removesuffix("/v1") + "/gyre/v1/executions/ex1/calls?full=1",
                headers={"Authorization": f"Bearer {key}"},
            )
        ).json()
        whole = proxy.calls("ex1", full=True)
        assert [c["prompt_ids"] for c in full["data"]] == [c.prompt_ids for c in whole]
        assert whole[0].prompt_ids == refs[0].prompt_tail  # the first call shares nothing
        r = await http.get(
            base.removesuffix("/v1") + "/gyre/v1/executions/ex1/calls?full=yes",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "full"
        r = await http.get(
            base.removesuffix("/v1") + "/gyre/v1/executions/ex1/calls",
            headers={"Authorization": f"Bearer {other}"},
        )
        assert r.status_code == 403
        await proxy.close("ex1")
        r = await http.post(
            "/chat/completions", json=GOOD, headers={"Authorization": f"Bearer {key}"}
        )
        assert r.status_code == 401  # a closed execution's key stops working
    with pytest.raises(KeyError):
        await proxy.close("ex1")


async def test_a_client_gone_mid_body_is_a_refused_request_not_a_crash(tok, anyio_backend):
    """An agent killed at its deadline while sending a request: seen in the field as a 40-line
    `ClientDisconnect` traceback from the ASGI server. It is counted as refused (499) instead."""
    proxy = make_proxy(tok, ScriptedEngine(eos_token_id=tok.eos_token_id))
    key = proxy.mint_key("gone")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
        ],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 40000),
    }
    incoming = iter(
        [
            {"type": "http.request", "body": b'{"model": "gyre", "mess', "more_body": True},
            {"type": "http.disconnect"},
        ]
    )
    sent = []

    async def receive():
        return next(incoming)

    async def send(message):
        sent.append(message)

    await proxy.app(scope, receive, send)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert json.loads(sent[1]["body"])["error"]["code"] == "client_closed_request"
    stats = proxy.statistics()
    assert (stats.requests_total, stats.requests_refused, stats.calls_recorded) == (1, 1, 0)


async def test_model_aliases_any_model_and_the_model_card(tok, anyio_backend):
    """A client's built-in default name is accepted when configured as an alias (or under
    `accept_any_model`), listed at /v1/models, and `GET /v1/models/{id}` answers per name."""
    engine = ScriptedEngine(eos_token_id=tok.eos_token_id)
    proxy = make_proxy(tok, engine, model_aliases=("gpt-4o", "org/model:v1"))
    auth = {"Authorization": f"Bearer {proxy.mint_key('e')}"}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base, timeout=30) as http:
        listed = [m["id"] for m in (await http.get("/models")).json()["data"]]
        assert listed == ["gyre", "gpt-4o", "org/model:v1"]
        card = (await http.get("/models/org/model:v1")).json()
        assert card == {"id": "org/model:v1", "object": "model", "created": 0, "owned_by": "gyre"}
        assert error_of(await http.get("/models/gpt-5"), 404)["code"] == "model_not_found"
        r = await http.post("/chat/completions", json=dict(GOOD, model="gpt-4o"), headers=auth)
        assert r.status_code == 200 and r.json()["model"] == "gyre"
        r = await http.post("/chat/completions", json=dict(GOOD, model="gpt-5"), headers=auth)
        assert "gpt-4o" in error_of(r, 404)["message"]
    anything = make_proxy(tok, ScriptedEngine(eos_token_id=tok.eos_token_id), accept_any_model=True)
    async with serving(anything) as base, httpx.AsyncClient(base_url=base, timeout=30) as http:
        assert (await http.get("/models/whatever")).json()["id"] == "whatever"
    with pytest.raises(ValueError, match="distinct non-empty"):
        make_proxy(tok, engine, model_aliases=("gyre",))


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "seed": 2**64},
            "seed",
        ),
        ("/v1/completions", {"prompt": "x", "seed": -(2**63) - 1}, "seed"),
        ("/v1/responses", {"input": "x", "seed": 2**70}, "seed"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_k": 2**63},
            "top_k",
        ),
        (
            "/v1/messages",
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": 2**70},
            None,
        ),
    ],
)
async def test_a_seed_or_top_k_past_64_bits_is_400_and_records_nothing(
    tok, anyio_backend, path, body, param
):
    """Was a 500 with a traceback after the engine had run: the call log (msgpack) cannot store
    an integer past 64 bits, so the finished call was lost. vLLM's range for `seed` is int64."""
    from tests.tito.conftest import asgi_post

    proxy = make_proxy(tok, ScriptedEngine(eos_token_id=tok.eos_token_id))
    key = proxy.mint_key("big")
    status, raw = await asgi_post(proxy, path, key, {"model": "gyre", **body})
    assert status == 400, raw
    err = json.loads(raw)["error"]
    assert err.get("param") == param and "64-bit" in err["message"], err
    assert proxy.statistics().calls_recorded == 0 and proxy.statistics().requests_refused == 1
    # the edges of the range are served and recorded
    edge = {**body, "seed": 2**63 - 1} if "seed" in body else {**body, "top_k": 2**63 - 1}
    status, raw = await asgi_post(proxy, path, key, {"model": "gyre", **edge})
    assert status == 200, raw
    assert proxy.statistics().calls_recorded == 1


async def test_every_refused_request_is_counted_as_a_request(tok, anyio_backend):
    """Unknown routes, the model card and the call listing were counted refused but not as
    requests, so `requests_refused` could exceed `requests_total`."""
    from tests.tito.conftest import asgi_post

    proxy = make_proxy(tok, ScriptedEngine(eos_token_id=tok.eos_token_id))
    key = proxy.mint_key("n")
    auth = {"Authorization": f"Bearer {key}"}
    async with serving(proxy) as base, httpx.AsyncClient(timeout=30) as http:
        root = base.removesuffix("/v1")
        statuses = [
            (await http.get(base + "/models/nope", headers=auth)).status_code,
            (await http.get(base + "/models/gyre", headers=auth)).status_code,
            (await http.get(base + "/models", headers=auth)).status_code,
            (await http.get(root + "/gyre/v1/executions/n/calls?full=x", headers=auth)).status_code,
            (await http.post(base + "/nothing", headers=auth, json={})).status_code,
        ]
    statuses.append((await asgi_post(proxy, "/v1/nothing/else", key, {}))[0])
    assert statuses == [404, 200, 200, 400, 404, 404]
    stats = proxy.statistics()
    assert (stats.requests_total, stats.requests_refused) == (6, 4)
