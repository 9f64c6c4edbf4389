"""What a Hugging Face chat template sees: chat messages as template dicts, and the message text
that must stay text.

Owns `message_to_template` (tool-call arguments as the template expects them: `arguments_for`,
decided per template by a probe render with `PROBE_ARGUMENTS`) and `LiteralText`, which locates
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
    replaced (the renderer's placeholders, field case B26).
    """
    text = message_text(m.content) if content is None else content
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
