"""The seam between an HTTP API and a chat call: one `ChatApi` per API the proxy serves.

Every API whose requests are conversations (OpenAI Chat Completions here; the Responses API and the
Anthropic Messages API beside it) is served by the same proxy route logic (`TitoProxy._serve_chat`):
the API decodes its body into its own request plus the equivalent `ChatCompletionRequest`, the
chat request is rendered, generated and recorded exactly like a Chat Completions call (one TITO
recording for every API), and the API answers in its own shape, whole or as server-sent events.
Knows nothing about routes, keys or engines.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from gyre.tito.detok import TokenText
from gyre.tito.generation import Call, Choice
from gyre.tito.openai_format import chat_completion, chat_stream, reply_message
from gyre.tito.openai_requests import decode_chat
from gyre.tito.recorder import Recorder
from gyre.tito.sessions import Execution
from gyre.tito.wire import (
    JSON_ENCODER,
    ChatCompletionRequest,
    ChatMessage,
    error_body,
)

__all__ = ["ChatApi", "Reply", "OpenAIChat"]

Reply = tuple[dict[str, Any], ChatMessage]
"""One choice's answer: (the OpenAI assistant message as JSON, the `ChatMessage` recorded and
compared with the client's echo), from `openai_format.reply_message`."""


class ChatApi(Protocol):
    """How one HTTP API maps onto a chat call.

    `native` is the API's own decoded request, passed back to `answer` and `stream` so they can
    echo what the client asked for (ids, metadata, instructions).
    """

    def decode(self, body: bytes, ex: Execution) -> tuple[Any, ChatCompletionRequest]:
        """(the API's request, the chat request it means). Raises ProxyError(400) for a body
        the API does not accept; `ex` holds per-execution state (e.g. a response chain)."""
        ...

    def answer(self, call: Call, native: Any, replies: list[Reply]) -> bytes:
        """The JSON body of a finished, recorded call."""
        ...

    def stream(
        self,
        call: Call,
        native: Any,
        events: AsyncIterator[tuple[Choice, int]],
        recorder: Recorder,
    ) -> AsyncGenerator[bytes, None]:
        """Server-sent events of a streamed call; records the call (through `recorder`) before
        its last event, and what was sampled when cut short (as `openai_format.chat_stream`)."""
        ...

    def error_body(self, message: str, *, type: str, code: str | None, param: str | None) -> bytes:
        """The API's JSON error body."""
        ...


class OpenAIChat:
    """OpenAI Chat Completions (`POST /v1/chat/completions`), the API every other maps onto.

    Args:
        text: the proxy's `TokenText` (logprob token strings).
        model: the served model name written into responses.
    """

    def __init__(self, *, text: TokenText, model: str) -> None:
        self.text, self.model = text, model

    def decode(
        self, body: bytes, ex: Execution
    ) -> tuple[ChatCompletionRequest, ChatCompletionRequest]:
        req = decode_chat(body)
        return req, req

    def answer(self, call: Call, native: ChatCompletionRequest, replies: list[Reply]) -> bytes:
        return JSON_ENCODER.encode(
            chat_completion(call, native, replies, text=self.text, model=self.model)
        )

    def stream(
        self,
        call: Call,
        native: ChatCompletionRequest,
        events: AsyncIterator[tuple[Choice, int]],
        recorder: Recorder,
    ) -> AsyncGenerator[bytes, None]:
        return chat_stream(
            call, native, events, text=self.text, model=self.model, recorder=recorder
        )

    def error_body(self, message: str, *, type: str, code: str | None, param: str | None) -> bytes:
        return error_body(message, type=type, code=code, param=param)


def replies_of(call: Call) -> list[Reply]:
    """The reply of every choice of a finished call, in choice order."""
    return [reply_message(call, ch) for ch in call.choices]
