"""Each message role a route accepts reaches every model format's chat template as that format
expects, or is refused with a 400 (issue 45): `developer` as `system` for templates that only
know `system`, and no message silently left out of the prompt by a template that has no branch
for it (`template_input.TemplateRoles`). Families: gyre's own template and the Qwen, Llama 3,
Mistral and DeepSeek templates of `tests/tito/families.py`."""

from __future__ import annotations

import json

import pytest

from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.model.recipe import build_tokenizer
from tests.tito.conftest import asgi_post, make_proxy
from tests.tito.families import FAMILIES, family_tokenizer

pytestmark = pytest.mark.anyio

MARK = "zebra quartz marker"
"""The text of the message under test: in the prompt unless the template drops it."""
HI = {"role": "user", "content": "hi"}
OK = {"role": "assistant", "content": "ok"}
GO = {"role": "user", "content": "go"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    ],
}
CHAT = {
    "system first": [{"role": "system", "content": MARK}, HI],
    "system later": [HI, OK, {"role": "system", "content": MARK}, GO],
    "developer first": [{"role": "developer", "content": MARK}, HI],
    "developer later": [HI, OK, {"role": "developer", "content": MARK}, GO],
    "user": [{"role": "user", "content": MARK}],
    "assistant": [HI, {"role": "assistant", "content": MARK}, GO],
    "tool": [HI, CALL, {"role": "tool", "tool_call_id": "call_1", "content": MARK}],
}
DROPPED = {("deepseek", "system later"), ("deepseek", "developer later")}
"""What these templates leave out: DeepSeek's renders a system prompt only from `messages[0]`."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    out = {"gyre": build_tokenizer()}
    for name in sorted(FAMILIES):
        out[name] = family_tokenizer(name, tmp_path_factory.mktemp(name))
    return out


async def post(tok, path: str, body: dict) -> tuple[int, dict, list[int] | None]:
    """(status, JSON answer, the prompt token IDs the engine got or None)."""
    engine = ScriptedEngine(
        [ScriptedReply(token_ids=tok.encode("fine", add_special_tokens=False))],
        eos_token_id=tok.eos_token_id,
        vocab_size=len(tok),
    )
    proxy = make_proxy(tok, engine)
    status, raw = await asgi_post(proxy, path, proxy.mint_key("roles"), body)
    prompt = engine.requests_seen[0].prompt_ids if engine.requests_seen else None
    return status, json.loads(raw), prompt


def rendered(tok, family: str, messages: list[dict]) -> str:
    """The template's own text for `messages` (the independent reference), tool-call arguments
    in the form the family's template takes (`Family.arguments_as`)."""
    if family != "gyre" and FAMILIES[family].arguments_as == "mapping":
        messages = [
            dict(
                m,
                tool_calls=[
                    dict(
                        c,
                        function=dict(
                            c["function"], arguments=json.loads(c["function"]["arguments"])
                        ),
                    )
                    for c in m["tool_calls"]
                ],
            )
            if m.get("tool_calls")
            else m
            for m in messages
        ]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("family", ["gyre", *sorted(FAMILIES)])
@pytest.mark.parametrize("case", list(CHAT))
async def test_chat_roles_reach_each_template_or_are_refused(toks, family, case):
    tok = toks[family]
    messages = CHAT[case]
    status, answer, prompt = await post(
        tok, "/v1/chat/completions", {"model": "gyre", "messages": messages}
    )
    at = next(i for i, m in enumerate(messages) if m["content"] == MARK)
    as_system = [dict(m, role="system") if m["role"] == "developer" else m for m in messages]
    if (family, case) in DROPPED:
        assert MARK not in rendered(tok, family, as_system)  # the template itself leaves it out
        assert status == 400 and answer["error"]["param"] == f"messages[{at}].role", answer
        return
    assert status == 200, answer
    assert prompt == tok.encode(rendered(tok, family, as_system), add_special_tokens=False)
    assert MARK in tok.decode(prompt)
    if case.startswith("developer"):  # no family template names `developer`: it is `system`
        assert "developer" not in tok.decode(prompt)


@pytest.mark.parametrize("family", ["gyre", *sorted(FAMILIES)])
async def test_the_legacy_function_role_is_refused(toks, family):
    messages = [HI, CALL, {"role": "function", "name": "ls", "content": MARK}]
    status, answer, prompt = await post(
        toks[family], "/v1/chat/completions", {"model": "gyre", "messages": messages}
    )
    assert status == 400 and answer["error"]["param"] == "messages[2].role" and prompt is None


RESPONSES = {
    "system first": ([{"role": "system", "content": MARK}, HI], CHAT["system first"]),
    "system later": (
        [
            HI,
            {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"role": "system", "content": MARK},
            GO,
        ],
        CHAT["system later"],
    ),
    "developer first": ([{"role": "developer", "content": MARK}, HI], CHAT["system first"]),
    "user": ([{"role": "user", "content": MARK}], CHAT["user"]),
    "assistant": (
        [HI, {"role": "assistant", "content": [{"type": "output_text", "text": MARK}]}, GO],
        CHAT["assistant"],
    ),
    "tool": (
        [
            HI,
            {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": MARK},
        ],
        CHAT["tool"],
    ),
}


@pytest.mark.parametrize("family", ["gyre", *sorted(FAMILIES)])
@pytest.mark.parametrize("case", list(RESPONSES))
async def test_responses_input_roles_reach_each_template_or_are_refused(toks, family, case):
    tok = toks[family]
    items, chat = RESPONSES[case]
    status, answer, prompt = await post(tok, "/v1/responses", {"model": "gyre", "input": items})
    if (family, case) in DROPPED:
        assert status == 400 and "system message after the first" in answer["error"]["message"]
        return
    assert status == 200, answer
    assert prompt == tok.encode(rendered(tok, family, chat), add_special_tokens=False)
    assert MARK in tok.decode(prompt)


MESSAGES = {
    "system": ({"system": MARK, "messages": [HI]}, CHAT["system first"]),
    "user": ({"messages": [{"role": "user", "content": MARK}]}, CHAT["user"]),
    "assistant": (
        {"messages": [HI, {"role": "assistant", "content": MARK}, GO]},
        CHAT["assistant"],
    ),
    "tool result": (
        {
            "messages": [
                HI,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "call_1", "name": "ls", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": MARK}],
                },
            ]
        },
        CHAT["tool"],
    ),
}


@pytest.mark.parametrize("family", ["gyre", *sorted(FAMILIES)])
@pytest.mark.parametrize("case", list(MESSAGES))
async def test_messages_roles_reach_each_template(toks, family, case):
    tok = toks[family]
    body, chat = MESSAGES[case]
    status, answer, prompt = await post(
        tok, "/v1/messages", {"model": "gyre", "max_tokens": 8, **body}
    )
    assert status == 200, answer
    assert prompt == tok.encode(rendered(tok, family, chat), add_special_tokens=False)
    assert MARK in tok.decode(prompt)
