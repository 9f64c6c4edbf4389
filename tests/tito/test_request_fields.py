"""Every request field is honoured, refused with a 400 naming it, or without effect (issue 45,
field case B34): docs/request_fields.md holds the table, and this walks it against the official
schemas (the `openai` and `anthropic` SDKs' params types, vLLM's own request protocol) and
against what the proxy does with each row's example."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import typing
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from tokenizers.processors import TemplateProcessing

from gyre.engines.protocol import StructuredOutput
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.model.recipe import build_tokenizer
from gyre.tito.messages_api import CountTokensRequest, MessagesRequest
from gyre.tito.responses_input import ResponsesRequest
from gyre.tito.wire import ChatCompletionRequest, CompletionRequest
from tests.tito.conftest import asgi_post, make_proxy, serving

pytestmark = pytest.mark.anyio

TABLE = Path(__file__).resolve().parents[2] / "docs" / "request_fields.md"
ROUTES = {
    "chat": (
        "/v1/chat/completions",
        {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]},
    ),
    "completions": ("/v1/completions", {"model": "gyre", "prompt": "hi"}),
    "responses": ("/v1/responses", {"model": "gyre", "input": "hi"}),
    "messages": (
        "/v1/messages",
        {"model": "gyre", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "count_tokens": (
        "/v1/messages/count_tokens",
        {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]},
    ),
}
STRUCTS = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
    "responses": ResponsesRequest,
    "messages": MessagesRequest,
    "count_tokens": CountTokensRequest,
}
LEGACY_GUIDED = {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}
REPLY = "Hello, the answer is 42."
KWARGS_BLOCK = (
    "{%- if reasoning_effort is defined %}<|im_start|>system\neffort {{ reasoning_effort }} "
    "thinking {{ enable_thinking }}<|im_end|>\n{% elif enable_thinking is defined %}"
    "<|im_start|>system\nthinking {{ enable_thinking }}<|im_end|>\n{% endif %}"
    "{%- if verbosity is defined %}<|im_start|>system\nverbosity {{ verbosity }}<|im_end|>\n"
    "{% endif %}"
)


@dataclass(frozen=True)
class Row:
    route: str
    field: str
    status: str
    example: dict
    why: str

    @property
    def id(self) -> str:
        return f"{self.route}-{self.field}-{self.status}"


def table() -> list[Row]:
    rows = []
    cell = re.compile(
        r"^\| (\w+) \| `([^`]+)` \| (honoured|refused|no-effect) \| `(.+)` \| (.+) \|$"
    )
    for line in TABLE.read_text().splitlines():
        if m := cell.match(line):
            rows.append(Row(m[1], m[2], m[3], json.loads(m[4]), m[5]))
    return rows


ROWS = table()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def walk_tok():
    """The tiny model's tokenizer with a template that reads the reasoning and verbosity kwargs
    (so rendering them shows) and a BOS added to text prompts (so `add_special_tokens` shows)."""
    tok = build_tokenizer()
    tok.chat_template = KWARGS_BLOCK + tok.chat_template
    bos = "<|endoftext|>"
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.convert_tokens_to_ids(bos))]
    )
    return tok


class WalkEngine(ScriptedEngine):
    """Records each request as asked (`asked`) and answers the same reply whatever the sampling
    controls mask: the walk compares requests, not what a constraint lets through."""

    def __init__(self, tok) -> None:
        reply = tok.encode(REPLY, add_special_tokens=False)
        super().__init__(
            rule=lambda *_: ScriptedReply(token_ids=reply),
            eos_token_id=tok.eos_token_id,
            vocab_size=len(tok),
        )
        self.asked: list = []

    async def generate(self, request):
        self.asked.append(request)
        masks = {
            "structured": None,
            "allowed_token_ids": None,
            "bad_words": (),
            "min_tokens": 0,
            "logit_bias": None,
        }
        fields = request.sampling.__struct_fields__
        free = msgspec.structs.replace(
            request.sampling, **{k: v for k, v in masks.items() if k in fields}
        )
        async for delta in super().generate(msgspec.structs.replace(request, sampling=free)):
            yield delta


@dataclass
class Outcome:
    status: int
    body: bytes
    engine: list

    def error(self) -> dict:
        return json.loads(self.body)


async def send(tok, route: str, patch: dict) -> Outcome:
    """`patch` merged into the route's minimal request, sent to a fresh proxy (one execution
    `walk`, so IDs repeat between runs); a `$previous` value names the response of a first,
    minimal request of the same execution."""
    path, base = ROUTES[route]
    engine = WalkEngine(tok)
    proxy = make_proxy(tok, engine, render_check_every=0)
    key = proxy.mint_key("walk")
    if patch.get("previous_response_id") == "$previous":
        status, first = await asgi_post(proxy, path, key, base)
        assert status == 200, first
        patch = dict(patch, previous_response_id=json.loads(first)["id"])
    status, body = await asgi_post(proxy, path, key, {**base, **patch})
    body = re.sub(rb'"(created|created_at)": ?[0-9]+', rb'"\1":0', body)
    return Outcome(status, body, [(r.prompt_ids, r.sampling) for r in engine.asked])


def names_field(route: str, out: Outcome, field: str) -> bool:
    error = out.error()["error"]
    if route in ("messages", "count_tokens"):  # Anthropic's errors name it in the message
        return field in error["message"]
    param = error.get("param") or ""
    return param == field or param.startswith((f"{field}.", f"{field}["))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
async def test_each_table_row_is_what_the_proxy_does(walk_tok, row: Row):
    with_field = await send(walk_tok, row.route, row.example)
    without = {k: v for k, v in row.example.items() if k != row.field}
    if row.field in ROUTES[row.route][1]:
        without[row.field] = ROUTES[row.route][1][row.field]  # a required field: the base value
    without_field = await send(walk_tok, row.route, without)
    assert without_field.status == 200, without_field.body
    if row.status == "refused":
        assert with_field.status == 400, with_field.body
        assert names_field(row.route, with_field, row.field), with_field.body
    elif row.status == "no-effect":
        assert with_field.status == 200, with_field.body
        assert with_field.engine == without_field.engine
        assert with_field.body == without_field.body
    elif row.field == "model":
        assert with_field.status == 404 and with_field.engine == [], with_field.body
    else:
        assert with_field.status == 200, with_field.body
        assert (with_field.engine, with_field.body) != (without_field.engine, without_field.body)


def _sdk_fields() -> dict[str, set[str]]:
    from anthropic.types import message_count_tokens_params as count_tokens
    from anthropic.types import message_create_params as messages
    from openai.types import completion_create_params as completions
    from openai.types.chat import completion_create_params as chat
    from openai.types.responses import response_create_params as responses

    out = {}
    for route, module, stem in (
        ("chat", chat, "CompletionCreateParams"),
        ("completions", completions, "CompletionCreateParams"),
        ("responses", responses, "ResponseCreateParams"),
        ("messages", messages, "MessageCreateParams"),
    ):
        out[route] = {
            name
            for kind in ("NonStreaming", "Streaming")
            for name in typing.get_type_hints(getattr(module, stem + kind))
        }
    out["count_tokens"] = set(typing.get_type_hints(count_tokens.MessageCountTokensParams))
    return out


def _vllm_fields() -> dict[str, set[str]]:
    """The fields of vLLM's chat and completions request models, read from the installed
    protocol modules' source (importing them costs ~20 s): the annotated, public class
    attributes of each pydantic model, whose base (`OpenAIBaseModel`) declares none."""
    root = Path(importlib.util.find_spec("vllm").origin).parent / "entrypoints" / "openai"
    out = {}
    for route, module, name in (
        ("chat", "chat_completion", "ChatCompletionRequest"),
        ("completions", "completion", "CompletionRequest"),
    ):
        tree = ast.parse((root / module / "protocol.py").read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        assert [ast.unparse(b) for b in cls.bases] == ["OpenAIBaseModel"], name
        out[route] = {
            s.target.id
            for s in cls.body
            if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)
            and not s.target.id.startswith("_")
            and "ClassVar" not in ast.unparse(s.annotation)
        }
    return out


def test_every_schema_field_has_a_row():
    """Each field of the SDK schemas, vLLM's chat and completions protocol, vLLM's legacy
    `guided_*` names and gyre's own request Structs is classified in docs/request_fields.md."""
    sdk, vllm = _sdk_fields(), _vllm_fields()
    assert {"messages", "tool_choice", "reasoning_effort"} <= sdk["chat"]  # read, not empty
    assert {"min_p", "structured_outputs", "continue_final_message"} <= vllm["chat"]
    for route, struct in STRUCTS.items():
        listed = {r.field for r in ROWS if r.route == route}
        wanted = sdk[route] | vllm.get(route, set()) | set(struct.__struct_fields__)
        if route in ("chat", "completions"):
            wanted |= LEGACY_GUIDED
        assert sorted(wanted - listed) == [], f"{route}: fields missing from {TABLE.name}"


@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_field_no_schema_lists_is_refused(walk_tok, route):
    out = await send(walk_tok, route, {"gyre_no_such_field": 1})
    assert out.status == 400 and out.engine == []
    assert names_field(route, out, "gyre_no_such_field"), out.body


# -- field case B34 -----------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
B34 = {
    "structured_outputs": {"structured_outputs": {"json": SCHEMA}},
    "guided_json": {"guided_json": SCHEMA},
    "guided_regex": {"guided_regex": "[0-9]+"},
    "guided_choice": {"guided_choice": ["yes", "no"]},
    "min_p": {"min_p": 0.05},
    "min_tokens": {"min_tokens": 3},
    "ignore_eos": {"ignore_eos": True},
    "bad_words": {"bad_words": ["answer"]},
    "allowed_token_ids": {"allowed_token_ids": [5, 6, 7]},
    "continue_final_message": {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
    "reasoning_effort": {"reasoning_effort": "high"},
    "functions": {"functions": [{"name": "ls", "parameters": {"type": "object"}}]},
    "function_call": {"function_call": "auto"},
}


@pytest.mark.parametrize("field", list(B34))
async def test_b34_sampling_and_rendering_fields_are_honoured_or_refused(walk_tok, field):
    """B34: each field changes the engine request or the prompt as it says, or is a 400 naming
    it; none is a 200 with the same sampling and prompt as without it (vLLM issue #53975, dynamo
    PR #12148)."""
    tok = walk_tok
    patch = B34[field]
    out = await send(tok, "chat", patch)
    base = await send(tok, "chat", {k: v for k, v in patch.items() if k != field})
    if field in ("functions", "function_call"):  # the legacy shape: refused, send tools
        assert out.status == 400 and out.error()["error"]["param"] == field
        return
    assert out.status == 200 and base.status == 200, (out.body, base.body)
    (prompt, s), (base_prompt, b) = out.engine[0], base.engine[0]
    if field == "continue_final_message":
        text = tok.apply_chat_template(
            patch["messages"],
            tokenize=False,
            add_generation_prompt=False,
            continue_final_message=True,
        )
        assert text.endswith("<|im_start|>assistant\nSure")  # the turn is left open
        assert prompt == tok.encode(text, add_special_tokens=False) != base_prompt
        return
    if field == "reasoning_effort":
        through = await send(tok, "responses", {"reasoning": {"effort": "high"}})
        assert prompt == through.engine[0][0] != base_prompt  # as through /v1/responses
        assert "effort high thinking True" in tok.decode(prompt)
        return
    assert prompt == base_prompt
    want = {
        "structured_outputs": {
            "structured": StructuredOutput(kind="json_schema", spec=json.dumps(SCHEMA))
        },
        "guided_json": {
            "structured": StructuredOutput(kind="json_schema", spec=json.dumps(SCHEMA))
        },
        "guided_regex": {"structured": StructuredOutput(kind="regex", spec="[0-9]+")},
        "guided_choice": {
            "structured": StructuredOutput(kind="grammar", spec='root ::= "yes" | "no"')
        },
        "min_p": {"min_p": 0.05},
        "min_tokens": {"min_tokens": 3},
        "ignore_eos": {"stop_token_ids": ()},
        "bad_words": {"bad_words": ("answer",)},
        "allowed_token_ids": {"allowed_token_ids": (5, 6, 7)},
    }[field]
    assert msgspec.structs.replace(b, **want) == s
    assert b != s
    assert tok.eos_token_id in b.stop_token_ids  # without ignore_eos the model's end stops


BAD = {
    "stream_options.continuous_usage_stats": {
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
    },
    "structured_outputs.disable_additional_properties": {
        "structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}
    },
    "structured_outputs.whitespace_pattern": {
        "structured_outputs": {"regex": "a", "whitespace_pattern": " "}
    },
    "structured_outputs.regex": {"structured_outputs": {"json": SCHEMA, "regex": "a"}},
    "structured_outputs": {"structured_outputs": {}},
    "guided_regex": {"guided_regex": "("},
    "guided_json": {"guided_json": SCHEMA, "response_format": {"type": "json_object"}},
    "guided_choice": {"guided_choice": []},
    "continue_final_message": {"continue_final_message": True},
    "min_tokens": {"min_tokens": 9, "max_tokens": 5},
    "allowed_token_ids": {"allowed_token_ids": [10**6]},
    "bad_words": {"bad_words": [" "]},
    "min_p": {"min_p": 1.5},
    "reasoning_effort": {"reasoning_effort": "extreme"},
    "messages[1].function_call": {
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "f", "arguments": "{}"},
            },
            {"role": "user", "content": "go"},
        ]
    },
}


@pytest.mark.parametrize("param", list(BAD))
async def test_a_bad_value_of_a_new_field_is_a_400_naming_it(walk_tok, param):
    """Malformed, conflicting or out-of-range values of the fields B34 added, nested fields
    refused unless they ask for nothing, and a message's legacy `function_call`."""
    out = await send(walk_tok, "chat", BAD[param])
    assert out.status == 400 and out.engine == [], out.body
    assert out.error()["error"]["param"] == param, out.body


# -- min_tokens and stop strings (as vLLM) ------------------------------------------------------


async def test_min_tokens_holds_stop_strings_until_it_is_reached(walk_tok):
    """A stop string counts only if it ends in a token after the first `min_tokens` (vLLM's
    detokenizer rule): the first `answer` of `Hello, the answer is the answer.` ends in token k,
    so min_tokens k - 1 stops there and min_tokens k passes it and stops at the second one."""
    tok = walk_tok
    text = "Hello, the answer is the answer."
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [tok.decode(ids[: i + 1]) for i in range(len(ids))]
    first = next(i for i, p in enumerate(pieces) if "answer" in p) + 1  # tokens to the first end
    assert 0 < first < len(ids)
    for min_tokens, content in ((first - 1, "Hello, the "), (first, "Hello, the answer is the ")):
        engine = ScriptedEngine(
            [ScriptedReply(token_ids=ids + [tok.eos_token_id])],
            eos_token_id=tok.eos_token_id,
            vocab_size=len(tok),
        )
        proxy = make_proxy(tok, engine)
        body = {"stop": ["answer"], "min_tokens": min_tokens}
        status, raw = await asgi_post(
            proxy, "/v1/chat/completions", proxy.mint_key("m"), {**ROUTES["chat"][1], **body}
        )
        assert status == 200, raw
        choice = json.loads(raw)["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == (content, "stop")


async def test_the_scripted_engine_refuses_a_token_the_controls_mask(walk_tok):
    """The fake engine honours what it can check: a scripted token outside `allowed_token_ids`,
    completing a bad word, or a stop token before `min_tokens` is a broken script."""
    from gyre.engines.protocol import GenerateRequest, SamplingParams
    from gyre.errors import EngineError

    tok = walk_tok
    word = tok.encode("answer", add_special_tokens=False)
    cases = {
        "allowed_token_ids excludes it": (SamplingParams(allowed_token_ids=(5,)), [5, 6]),
        "it completes a bad word": (SamplingParams(bad_words=("answer",)), [5, *word]),
        "min_tokens=3 masks stop tokens": (
            SamplingParams(min_tokens=3, stop_token_ids=(tok.eos_token_id,)),
            [5, tok.eos_token_id],
        ),
    }
    for why, (sampling, script) in cases.items():
        engine = ScriptedEngine(
            [ScriptedReply(token_ids=script)], tokenizer=tok, vocab_size=len(tok)
        )
        request = GenerateRequest(request_id="r", prompt_ids=[5], sampling=sampling)
        with pytest.raises(EngineError, match=why):
            async for _ in engine.generate(request):
                pass


# -- on vLLM (slow tier) -------------------------------------------------------------------------


@pytest.mark.slow
async def test_b34_fields_reach_vllm(vllm_engine):
    """Through a real vLLM cell: `allowed_token_ids`, `bad_words`, `min_tokens`, `ignore_eos`,
    `guided_choice` and `min_p` shape what vLLM samples (random weights, so each is checked by
    what it forbids), not just the request."""
    import openai
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(vllm_engine.tokenizer_dir))
    eos = tok.eos_token_id
    x, y = (tok.encode(t, add_special_tokens=False) for t in ("x", "y"))
    assert len(x) == len(y) == 1
    proxy = make_proxy(tok, vllm_engine)
    key = proxy.mint_key("b34")
    messages = [{"role": "user", "content": "Say something."}]
    async with serving(proxy) as base:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)

        async def ask(temperature: float = 1.0, **extra):
            r = await client.chat.completions.create(
                model="gyre",
                messages=messages,
                max_tokens=8,
                temperature=temperature,
                extra_body=extra,
            )
            return r.choices[0], r.choices[0].model_extra["token_ids"]

        for seed in range(3):
            # `x` banned as a bad word: only `y` is left to sample
            _, ids = await ask(seed=seed, allowed_token_ids=x + y, bad_words=["x"])
            assert set(ids) == set(y), ids
            # EOS masked for the first 5 tokens, then allowed
            _, ids = await ask(seed=seed, allowed_token_ids=[eos, *y], min_tokens=5)
            assert ids[:5] == y * 5, ids
            # EOS does not stop the choice: max_tokens does
            choice, ids = await ask(seed=seed, allowed_token_ids=[eos, *y], ignore_eos=True)
            assert (len(ids), choice.finish_reason) == (8, "length")
            choice, _ = await ask(seed=seed, guided_choice=["yes", "no"])
            assert choice.message.content in ("yes", "no")
        # min_p 1 keeps only the most likely token: greedy
        _, sampled = await ask(seed=1, min_p=1.0)
        _, greedy = await ask(temperature=0.0)
        assert sampled == greedy
        await client.close()
