"""Constraints: what a chat request demands of the reply's shape, as a grammar the engine enforces.

Owns `ToolCallFormat` (how a model writes reasoning and tool calls: its tags; `GYRE_FORMAT` is the
tiny model's `<think>` + `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`),
`tool_demands`, which turns `tool_choice` (`required`, a named function), `parallel_tool_calls`
false, `strict` function tools and `response_format` (`json_object`, `json_schema`) into one
xgrammar structural tag (`StructuredOutput`), `request_constraint` (vLLM's `structured_outputs`
and legacy `guided_*` fields), and `chat_constraint` / `completion_constraint`, the one grammar
of a request, or None when it constrains nothing. An unsatisfiable or malformed demand is a 400
naming the parameter (with xgrammar's reason, not its C++ source location; `check_json_schema`
checks a route's own output format under its own name). The engine masks the tokens the grammar
forbids, so the constraint holds in every reply and the recorded behaviour logprobs are those of
the masked distribution, the one sampled from (docs/design.md invariant 2). Knows nothing about
tokens, engines or HTTP.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from gyre.engines.protocol import StructuredOutput
from gyre.errors import ProxyError
from gyre.tito.openai_requests import proxy_error
from gyre.tito.wire import ChatCompletionRequest, CompletionRequest

__all__ = [
    "ToolCallFormat",
    "GYRE_FORMAT",
    "chat_constraint",
    "completion_constraint",
    "request_constraint",
    "tool_demands",
    "check_json_schema",
]


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """How a model writes a reply: an optional reasoning block, then content or tool calls.

    A tool call is `call_begin + {"name": <name>, "arguments": <object>} + call_end`; calls follow
    each other with `call_separator` between them. `reasoning` is the (open, close) tag pair of a
    leading reasoning block, or None for a model without one.
    """

    call_begin: str
    call_end: str
    call_separator: str = ""
    reasoning: tuple[str, str] | None = None

    def call_schema(self, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """The JSON schema of the object between the call tags for the function `name`."""
        return {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    def call_tag(self, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """The structural-tag `tag` format of one call of function `name`."""
        return {
            "type": "tag",
            "begin": self.call_begin,
            "content": {
                "type": "json_schema",
                "json_schema": self.call_schema(name, parameters),
                "max_whitespace_cnt": 1,  # a canonical call needs one space; no runs of blanks
            },
            "end": self.call_end,
        }


GYRE_FORMAT = ToolCallFormat(
    call_begin="<tool_call>", call_end="</tool_call>", reasoning=("<think>", "</think>")
)
"""The tiny model's format (`gyre/model/recipe.py` chat template; parsed by `gyre.tito.reply`)."""


def _bad(message: str, param: str) -> ProxyError:
    return proxy_error(message, 400, "invalid_value", param=param)


def _functions(req: ChatCompletionRequest) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters schema (an absent schema accepts any object)."""
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(req.tools or ()):
        fn = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}] must be a function tool with a string name", f"tools[{i}]")
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema", f"tools[{i}]")
        out[fn["name"]] = params
    return out


def _strict(req: ChatCompletionRequest) -> bool:
    """Whether a function tool asks for `strict: true` (its calls' arguments must match its
    parameters schema: OpenAI API reference, Chat, "tools"); 400 for a `strict` that is not a
    boolean."""
    found = False
    for i, tool in enumerate(req.tools or ()):
        strict = tool["function"].get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise _bad(f"tools[{i}].function.strict={strict!r} must be a boolean", f"tools[{i}]")
        found = found or strict is True
    return found


def _tool_mode(req: ChatCompletionRequest, functions: dict[str, Any]) -> tuple[str, list[str]]:
    """(`none` | `auto` | `required`, the functions a call may name)."""
    choice = req.tool_choice
    if choice is None:
        return ("auto" if functions else "none"), list(functions)
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _bad(
                f"tool_choice={choice!r} must be 'none', 'auto', 'required' or a named function",
                "tool_choice",
            )
        if choice != "none" and not functions:
            raise _bad(f"tool_choice={choice!r} needs at least one tool in tools", "tool_choice")
        return choice, list(functions)
    fn = choice.get("function") if choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _bad(
            'a named tool_choice is {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in functions:
        raise _bad(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
    return "required", [name]


def _content_schema(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any] | None:
    """The JSON schema `response_format` asks the content to match (None: free text)."""
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return {"type": "object"}
    if rf.type == "json_schema":
        schema = (rf.json_schema or {}).get("schema")
        if not isinstance(schema, dict):
            raise _bad(
                "response_format json_schema needs json_schema.schema (a JSON schema object)",
                "response_format",
            )
        check_json_schema(schema, "response_format")
        return schema
    raise _bad(
        f"response_format type {rf.type!r} must be 'text', 'json_object' or 'json_schema'",
        "response_format",
    )


def chat_constraint(
    req: ChatCompletionRequest, fmt: ToolCallFormat | None = GYRE_FORMAT
) -> StructuredOutput | None:
    """The grammar a chat request's replies must match: vLLM's `structured_outputs` (or a legacy
    `guided_*` field: `request_constraint`) for the whole reply, else what the tool and format
    demands ask for (`tool_demands`). 400 naming the vLLM field when both ask for something."""
    explicit = request_constraint(req)
    implied = tool_demands(req, fmt)
    if explicit is None:
        return implied
    field, grammar = explicit
    if implied is not None or _content_schema(req) is not None:
        raise _bad(
            f"{field} cannot be combined with response_format, a required or named tool_choice, "
            "parallel_tool_calls false or strict tools (each constrains the reply)",
            field,
        )
    return grammar


def completion_constraint(req: CompletionRequest) -> StructuredOutput | None:
    """The grammar a completions request's text must match: `response_format` (`json_object`,
    `json_schema`) or vLLM's `structured_outputs` / `guided_*` (400 for both)."""
    explicit = request_constraint(req)
    content = _content_schema(req)
    if explicit is not None and content is not None:
        raise _bad(f"{explicit[0]} cannot be combined with response_format", explicit[0])
    if explicit is not None:
        return explicit[1]
    return (
        None if content is None else StructuredOutput(kind="json_schema", spec=json.dumps(content))
    )


def request_constraint(
    req: ChatCompletionRequest | CompletionRequest,
) -> tuple[str, StructuredOutput] | None:
    """(the field, its grammar) for vLLM's `structured_outputs` (exactly one of `json`, `regex`,
    `choice`, `grammar`, `json_object`, `structural_tag`) or a legacy `guided_json`,
    `guided_regex`, `guided_choice`, `guided_grammar`; None when the request sends none. A
    `choice` is the grammar of its texts (as vLLM's xgrammar backend writes it), a `grammar`
    EBNF in xgrammar's dialect. 400 naming the field for two demands, an empty one, or one
    xgrammar cannot compile."""
    so = req.structured_outputs
    asked: list[tuple[str, str, Any]] = []
    if so is not None:
        for name in ("json", "regex", "choice", "grammar", "json_object", "structural_tag"):
            if getattr(so, name) is not None:
                asked.append((f"structured_outputs.{name}", name, getattr(so, name)))
        if not asked:
            raise _bad(
                "structured_outputs needs one of json, regex, choice, grammar, json_object, "
                "structural_tag",
                "structured_outputs",
            )
    for name in ("json", "regex", "choice", "grammar"):
        value = getattr(req, f"guided_{name}")
        if value is not None:
            asked.append((f"guided_{name}", name, value))
    if not asked:
        return None
    if len(asked) > 1:
        raise _bad(
            f"{asked[1][0]} cannot be combined with {asked[0][0]} (one constraint per request)",
            asked[1][0],
        )
    field, name, value = asked[0]
    if name == "json":
        grammar = StructuredOutput(
            kind="json_schema", spec=value if isinstance(value, str) else json.dumps(value)
        )
    elif name == "json_object":
        if value is not True:
            raise _bad(f"{field} must be true", field)
        grammar = StructuredOutput(kind="json_object")
    elif name == "choice":
        if not value:
            raise _bad(f"{field} needs at least one choice", field)
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
        grammar = StructuredOutput(kind="grammar", spec=f"root ::= {alternatives}")
    elif name == "regex":
        grammar = StructuredOutput(kind="regex", spec=value)
    elif name == "grammar":
        grammar = StructuredOutput(kind="grammar", spec=value)
    else:
        grammar = StructuredOutput(kind="structural_tag", spec=value)
    _check(grammar.kind, grammar.spec, field)
    return field, grammar


def tool_demands(
    req: ChatCompletionRequest, fmt: ToolCallFormat | None = GYRE_FORMAT
) -> StructuredOutput | None:
    """The grammar a chat request's tool and format demands ask of its replies, in the model's
    format `fmt` (None: a
    format with no `ToolCallFormat` yet, e.g. a vLLM tool parser: demands on tool calls are then
    refused with a 400, `strict` tools are served unenforced (the OpenAI Agents SDK marks every
    tool strict; docs/design.md "Not built yet"), and `response_format` constrains the whole
    reply to JSON).

    - `tool_choice` `required` (or a named function): from its first token (no reasoning block,
      as vLLM's own server forces the call at once) the reply is one or more calls (exactly one
      for a named function or `parallel_tool_calls: false`) of the offered functions, arguments
      matching their schemas;
    - `tool_choice` `auto` with `parallel_tool_calls: false`: free text with at most one call;
    - `tool_choice` `auto` with a `strict` tool: free text and calls, each call of an offered
      function with arguments matching its schema;
    - `response_format` `json_object` / `json_schema`: the reply is JSON (matching the
      schema) from its first token; with tools offered under `auto`, calls are the alternative.
    Otherwise None (nothing to enforce). Raises `ProxyError` 400 for a demand that names an
    unknown tool, needs tools that were not offered, or a malformed `response_format`.
    Format: xgrammar's structural tag (xgrammar docs, "Structural Tag"), which vLLM's
    `StructuredOutputsParams.structural_tag` takes as is.
    """
    functions = _functions(req)
    mode, names = _tool_mode(req, functions)
    content = _content_schema(req)
    single = req.parallel_tool_calls is False
    strict = _strict(req)
    if fmt is None:
        if mode == "required" or (mode == "auto" and (single or content is not None)):
            raise _bad(
                "tool_choice 'required' / named and parallel_tool_calls false are enforced only "
                "for gyre's tool-call format (proxy tool_parser 'gyre')",
                "tool_choice",
            )
        if content is None:
            return None
        return StructuredOutput(kind="json_schema", spec=json.dumps(content))
    tags = [fmt.call_tag(n, functions[n]) for n in names]
    if mode == "required":
        if content is not None:
            raise _bad(
                "response_format cannot be combined with a required or named tool_choice",
                "response_format",
            )
        body: dict[str, Any] = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": fmt.call_separator,
            "at_least_one": True,
            "stop_after_first": single or isinstance(req.tool_choice, dict),
        }
    elif content is not None and mode != "auto":
        # JSON alone: vLLM's JSON path, which compiles it compact (the engine sets
        # `disable_any_whitespace`; a structural tag's JSON allows any run of whitespace, and an
        # untrained model fills `max_tokens` with it).
        return StructuredOutput(kind="json_schema", spec=json.dumps(content))
    elif content is not None:
        body = {"type": "json_schema", "json_schema": content}
        if mode == "auto":
            calls = {
                "type": "tags_with_separator",
                "tags": tags,
                "separator": fmt.call_separator,
                "at_least_one": True,
                "stop_after_first": single,
            }
            body = {"type": "or", "elements": [body, calls]}
    elif mode == "auto" and (single or strict):
        body = {
            "type": "triggered_tags",
            "triggers": [fmt.call_begin],
            "tags": tags,
            "stop_after_first": single,
        }
    else:
        return None
    # A forced call or JSON starts at the first token, as in vLLM's server without a reasoning
    # parser; only free text with at most one call may open with the reasoning block.
    if fmt.reasoning is not None and content is None and mode == "auto":
        think = {
            "type": "tag",
            "begin": fmt.reasoning[0],
            "content": {"type": "any_text"},
            "end": fmt.reasoning[1],
        }
        lead = {"type": "sequence", "elements": [think, {"type": "const_string", "value": "\n"}]}
        body = {"type": "sequence", "elements": [{"type": "optional", "content": lead}, body]}
    spec = json.dumps({"type": "structural_tag", "format": body})
    _check("structural_tag", spec, "tools")
    return StructuredOutput(kind="structural_tag", spec=spec)


def check_json_schema(schema: dict[str, Any], param: str) -> None:
    """400 naming `param` (a route's own name of the output format: `text.format`,
    `output_config.format`) for a JSON schema xgrammar cannot compile."""
    _check("json_schema", json.dumps(schema), param)


def _check(kind: str, spec: str, param: str) -> None:
    """400 naming `param` for a grammar of `kind` xgrammar cannot compile (a malformed client
    schema, regex or grammar), with xgrammar's reason."""
    why = _compile_error(kind, spec)
    if why is not None:
        raise _bad(f"{param}: the requested output format cannot be enforced: {why}", param)


_SOURCE = re.compile(r"\[[0-9:.]+\] \S+:[0-9]+: |Check failed: \(.*?\) is false: ")
"""What xgrammar's C++ errors start with: a time, a source file and line, a failed check."""


@functools.lru_cache(maxsize=256)
def _compile_error(kind: str, spec: str) -> str | None:
    """Why xgrammar cannot compile a grammar of `kind` (its own message, less its C++ source
    location), or None when it compiles. Cached: an agent sends the same tools on every call,
    and compiling costs milliseconds."""
    import xgrammar as xgr

    compile_: Any = {
        "json_schema": xgr.Grammar.from_json_schema,
        "regex": xgr.Grammar.from_regex,
        "grammar": xgr.Grammar.from_ebnf,
        "structural_tag": xgr.Grammar.from_structural_tag,
    }.get(kind)
    if compile_ is None:  # json_object: no spec
        return None
    try:
        compile_(spec)
    except Exception as exc:  # xgrammar raises RuntimeError, ValueError or pydantic errors
        return _SOURCE.sub("", str(exc)).strip()
    return None
