"""What a Hugging Face chat template sees: chat messages as template dicts, and the message text
that must stay text.

Owns `message_to_template` (tool-call arguments as the template expects them: `arguments_for`,
decided per template by a probe render with `PROBE_ARGUMENTS`), `TemplateRoles` (which chat roles
a template renders where, by probe renders: `developer` reaches a template that does not name it
as `system`, and a message the template would drop is refused) and `LiteralText`, which locates
non-assistant message text holding added-token text in a render with `placeholder`s, so that
`ChatRenderer.encode` tokenizes it as plain text (field case B26). Knows nothing about prompts,
parents or HTTP.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from tokenizers import Tokenizer

from gyre.tito.reply import loads_or_none
from gyre.tito.wire import ChatMessage, message_text

__all__ = [
    "message_to_template",
    "TemplateRoles",
    "arguments_for",
    "PROBE_ARGUMENTS",
    "PLACEHOLDER",
    "placeholder",
    "LiteralText",
]


def message_to_template(
    m: ChatMessage, *, arguments_as: str = "string", content: str | None = None
) -> dict[str, Any]:
    """The dict a Hugging Face chat template sees for one message.

    `arguments_as`: tool-call arguments reach the template as the JSON text the client sent
    (`string`) or, for templates that `tojson` them (Qwen 2.5, Llama 3), as the decoded object
    (`mapping`; arguments that are not a JSON object stay text). `content`: the message's text
    replaced (the renderer's placeholders, field case B26). Content is None only for an
    assistant message of tool calls (OpenAI's shape, which templates test for); any other
    message without text (`check_messages` lets only a reasoning-only assistant message through)
    gets "", never a None a template could print as `None`.
    """
    text = message_text(m.content) if content is None else content
    if text is None and not m.tool_calls:
        text = ""
    d: dict[str, Any] = {"role": m.role, "content": text}
    if m.name is not None:
        d["name"] = m.name
    reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
    if reasoning is not None:
        d["reasoning_content"] = reasoning
    if m.tool_calls is not None:
        d["tool_calls"] = [
            {
                "id": tc.id,
                "type": tc.type,
                "function": {
                    "name": tc.function.name,
                    "arguments": arguments_for(tc.function.arguments, arguments_as),
                },
            }
            for tc in m.tool_calls
        ]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    return d


def arguments_for(arguments: Any, arguments_as: str) -> Any:
    """Tool-call arguments as `message_to_template` passes them (`arguments_as`: `string` or
    `mapping`; text that is not a JSON object stays text)."""
    if arguments_as == "mapping" and isinstance(arguments, str):
        obj = loads_or_none(arguments)
        return obj if isinstance(obj, dict) else arguments
    return arguments


PROBE_ARGUMENTS = '{"gyre_probe": "v"}'
"""The arguments of the probe render that decides `arguments_as` per template."""
PLACEHOLDER = re.compile("\ue000([0-9]+)\ue001")
"""A `placeholder` in a render; group 1 is the message index."""


def placeholder(i: int) -> str:
    """Stands in for message `i`'s text in a locating render (private-use characters)."""
    return f"\ue000{i}\ue001"


class LiteralText:
    """Message text holding added-token text (`<|im_end|>`, `<tool_call>`), located in this
    thread's latest render so that `ChatRenderer.encode` tokenizes it as plain text (field case
    B26). Renders run on the event loop and in worker threads: one located render per thread."""

    def __init__(self, tokenizer: Any) -> None:
        backend = tokenizer.backend_tokenizer
        added = sorted(
            {t.content for t in backend.get_added_tokens_decoder().values()}, key=len, reverse=True
        )
        self.pattern = re.compile("|".join(map(re.escape, added))) if added else None
        spec = json.loads(backend.to_str())
        for t in spec.get("added_tokens", ()):
            t["special"] = True  # every added token, structural tags included, becomes text
        self.plain = Tokenizer.from_str(json.dumps(spec))
        """The tokenizer with no added token matched in the input (`encode_special_tokens`)."""
        self.plain.encode_special_tokens = True
        self._local = threading.local()

    def forget(self) -> None:
        self._local.render = None

    def forged(self, messages: list[ChatMessage]) -> dict[int, str]:
        """{index: text} of the non-assistant messages whose text holds an added token's text
        (assistant text is the model's own: its tags are real)."""
        if self.pattern is None:
            return {}
        out = {}
        for i, m in enumerate(messages):
            if m.role != "assistant":
                text = message_text(m.content)
                if text and self.pattern.search(text):
                    out[i] = text
        return out

    def locate(self, text: str, template: str, forged: dict[int, str]) -> None:
        """Remember where `forged` texts lie in `text`, given `template`: the same render with
        placeholders in their place. Nothing is remembered if the two do not agree."""
        parts, spans, pos, size, seen = [], [], 0, 0, set()
        for m in PLACEHOLDER.finditer(template):
            i = int(m.group(1))
            if i not in forged:
                return
            seen.add(i)
            parts.append(template[pos : m.start()])
            size += m.start() - pos
            spans.append((size, size + len(forged[i])))
            parts.append(forged[i])
            size += len(forged[i])
            pos = m.end()
        parts.append(template[pos:])
        if seen == set(forged) and "".join(parts) == text:
            self._local.render = (text, spans)

    def spans_of(self, piece: str) -> list[tuple[int, int]]:
        """The located spans inside `piece`, a suffix of this thread's latest render."""
        render = getattr(self._local, "render", None)
        if render is None:
            return []
        text, spans = render
        if not text.endswith(piece):
            return []
        off = len(text) - len(piece)
        return [(max(a - off, 0), b - off) for a, b in spans if b > off]


_PROBE_TEXT = "gyre role probe 7f3a"
"""The content of a probe message: found in the render unless the template drops it."""


class TemplateRoles:
    """How chat roles reach one chat template, decided once by probe renders.

    `developer` (OpenAI's newer name of the system role) reaches a template that does not name
    that role as `system`; a template that names it (gpt-oss) gets it as is. `drops` holds the
    (role, first) pairs whose message the template renders without its text (e.g. a system
    message after the first message, for a template that reads only `messages[0]`): such a
    message is refused rather than silently left out of the prompt. A probe the template raises
    on decides nothing (the real render then says what is wrong).

    Args:
        tokenizer: a `transformers` tokenizer with a chat template.
        arguments_as: how tool-call arguments reach the template (`ChatRenderer.arguments_as`).
    """

    def __init__(self, tokenizer: Any, arguments_as: str) -> None:
        self.arguments_as = arguments_as
        source = getattr(tokenizer, "chat_template", None)
        self.developer_as = (
            "developer" if isinstance(source, str) and "developer" in source else ("system")
        )
        call: dict[str, Any] = {
            "id": "abcdefghi",
            "type": "function",
            "function": {
                "name": "gyre_probe",
                "arguments": arguments_for(PROBE_ARGUMENTS, arguments_as),
            },
        }
        u: dict[str, Any] = {"role": "user", "content": "u"}
        a: dict[str, Any] = {"role": "assistant", "content": "a"}
        probes: dict[tuple[str, bool], list[dict[str, Any]]] = {
            ("user", True): [],
            ("user", False): [u, a],
            ("assistant", True): [],
            ("assistant", False): [u],
            ("system", True): [],
            ("system", False): [u, a],
            ("tool", False): [u, {"role": "assistant", "content": "", "tool_calls": [call]}],
        }
        if self.developer_as == "developer":
            probes |= {("developer", True): [], ("developer", False): [u, a]}
        self.drops: set[tuple[str, bool]] = set()
        for (role, first), before in probes.items():
            probe: dict[str, Any] = {"role": role, "content": _PROBE_TEXT}
            if role == "tool":
                probe["tool_call_id"] = call["id"]
            after = [] if role in ("user", "tool") else [{"role": "user", "content": "v"}]
            try:
                text = tokenizer.apply_chat_template(
                    [*before, probe, *after], tokenize=False, add_generation_prompt=True
                )
            except Exception:  # the template refuses this conversation: the probe says nothing
                continue
            if _PROBE_TEXT not in text:
                self.drops.add((role, first))

    def template_role(self, role: str) -> str:
        """The role a message of `role` has in the template's input."""
        return self.developer_as if role == "developer" else role

    def message(self, m: ChatMessage, content: str | None = None) -> dict[str, Any]:
        """`message_to_template` for this template: its arguments' form, its role."""
        d = message_to_template(m, arguments_as=self.arguments_as, content=content)
        d["role"] = self.template_role(m.role)
        return d

    def dropped(self, messages: list[ChatMessage]) -> tuple[int, str] | None:
        """(index, why) of the first message this template would leave out of the prompt, or
        None."""
        for i, m in enumerate(messages):
            if (self.template_role(m.role), i == 0) in self.drops:
                where = "as the first message" if i == 0 else "after the first message"
                why = (
                    f"this model's chat template does not render a {m.role} message {where} (it "
                    "would be left out of the prompt)"
                )
                return i, why
        return None
