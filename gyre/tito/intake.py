"""Intake: a decoded OpenAI request of an execution to a started `Call`.

Owns `CallIntake`, which renders a chat request's messages to prompt token IDs (on the event loop
for a few new messages, in a worker thread for much text) or tokenizes a completions prompt (or
takes its token IDs), links the prompt to the execution's render state, builds its sampling
parameters and starts its `Call` (refused with 409 if the execution closed meanwhile). Knows
nothing about HTTP, routes, retries or the call log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from gyre.config import ProxyConfig
from gyre.engines.protocol import InferenceEngine, StructuredOutput
from gyre.errors import ConfigError, ProxyError
from gyre.tito.constraints import GYRE_FORMAT, chat_constraint, completion_constraint
from gyre.tito.generation import Call
from gyre.tito.model_format import TOOL_CALL_IDS, ModelFormat
from gyre.tito.openai_requests import (
    proxy_error,
    sampling_params,
    stop_strings,
    template_kwargs,
)
from gyre.tito.records import Role
from gyre.tito.render import ChatRenderer
from gyre.tito.render_state import Node, Rendered, link_tokens
from gyre.tito.sessions import Execution
from gyre.tito.wire import ChatCompletionRequest, CompletionRequest, message_text

__all__ = ["CallIntake"]

_T = TypeVar("_T")

_INLINE_RENDER_BYTES = 32 * 1024
"""Chat requests adding up to this much text to a known parent (or whose whole body is this
small) are rendered on the event loop thread; others in a worker thread."""


class CallIntake:
    """Starts the `Call` of a chat or completions request.

    Args:
        tokenizer: the served model's `transformers` fast tokenizer.
        renderer: the proxy's `ChatRenderer` (its `text` interns token IDs).
        engine_for: the engine serving an execution.
        config: `ProxyConfig` (the sampling limits).
    """

    def __init__(
        self,
        *,
        tokenizer: Any,
        renderer: ChatRenderer,
        engine_for: Callable[[str], InferenceEngine],
        config: ProxyConfig,
    ) -> None:
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.text = renderer.text
        self.engine_for = engine_for
        self.config = config
        self.model_format = ModelFormat.load(
            tokenizer, tool_parser=config.tool_parser, reasoning_parser=config.reasoning_parser
        )
        """The reply parser and the stop IDs (the tokenizer's EOS + the model's
        `generation_config.json` end IDs); `ConfigError` for an unknown parser."""
        self.stop_token_ids: tuple[int, ...] = self.model_format.stop_token_ids
        self._check_tool_ids()

    def _check_tool_ids(self) -> None:
        """`ConfigError` when the template refuses the tool-call IDs this format mints but
        takes another format's: every tool loop's second turn would be a 400 (B35)."""
        mine = self.model_format.tool_ids
        why = self.renderer.refuses_tool_id(mine.mint("gyre", "c0", 0))
        if why is None:
            return
        for name, other in TOOL_CALL_IDS.items():
            if other != mine and self.renderer.refuses_tool_id(other.mint("gyre", "c0", 0)) is None:
                raise ConfigError(
                    f"the chat template refuses the tool-call IDs that tool_parser="
                    f"{self.config.tool_parser!r} mints ({why}) and takes {name!r} ones: set the "
                    f"tool parser of the model's format (vLLM's 'mistral' mints 9 letters and "
                    f"digits)"
                )

    @staticmethod
    def _check_open(ex: Execution) -> None:
        """409 for a call whose execution was closed while its request was being read or
        rendered: it would be recorded after the execution's end entry."""
        if ex.closed:
            raise proxy_error(f"execution {ex.execution_id!r} was closed", 409, "execution_closed")

    async def chat(
        self, ex: Execution, role: Role, body: bytes, req: ChatCompletionRequest
    ) -> Call:
        """Render a chat request and start its `Call`."""
        started = time.time()
        engine = self.engine_for(ex.execution_id)
        gyre_format = getattr(self.model_format.parser, "name", "gyre") == "gyre"
        structured = chat_constraint(req, GYRE_FORMAT if gyre_format else None)
        tools, kwargs, parent = self._render_input(ex, req)

        def render() -> Rendered:
            return self.renderer.render_chat(
                ex.render,
                req.messages,
                tools,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                template_kwargs=kwargs,
                parent=parent,
            )

        rendered = await self._run_render(ex, body, req, parent, render)
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        return self._start(
            ex,
            engine=engine,
            role=role,
            started_s=started,
            rendered=rendered,
            req=req,
            max_tokens=max_tokens,
            prompt_len=len(rendered.prompt_ids),
            structured=structured,
            parse_tools=bool(tools) and req.tool_choice != "none",
            template_kwargs=kwargs,
        )

    def _render_input(
        self, ex: Execution, req: ChatCompletionRequest
    ) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None, Node | None]:
        """What `chat` and `count` render `req` with: its tools (None when it has none), the
        template kwargs and the parent node the execution's render state finds for it."""
        tools = req.tools or None
        kwargs = self._template_input(req)
        return tools, kwargs, self.renderer.find_parent(ex.render, req.messages, tools, kwargs)

    async def count(self, ex: Execution, body: bytes, req: ChatCompletionRequest) -> int:
        """The length of the prompt `chat` would render for `req` now (`ChatRenderer.count_chat`:
        the same parent and path), rendered as `chat` renders it; starts nothing and leaves the
        execution's render state as it was. Raises ProxyError(400) for messages the template
        refuses."""
        tools, kwargs, parent = self._render_input(ex, req)

        def count() -> int:
            return self.renderer.count_chat(
                ex.render,
                req.messages,
                tools,
                add_generation_prompt=req.add_generation_prompt,
                template_kwargs=kwargs,
                parent=parent,
            )

        return await self._run_render(ex, body, req, parent, count)

    def _template_input(self, req: ChatCompletionRequest) -> dict[str, Any] | None:
        """The template kwargs of a chat request (`openai_requests.template_kwargs`), once its
        messages and rendering switches are checked: 400 for a message the template would drop
        (`template_input.TemplateRoles`) or `continue_final_message` with a generation prompt."""
        if req.continue_final_message and req.add_generation_prompt:
            raise proxy_error(
                "continue_final_message needs add_generation_prompt: false (the reply continues "
                "the last message instead of starting a new one)",
                400,
                "invalid_value",
                param="continue_final_message",
            )
        if dropped := self.renderer.roles.dropped(req.messages):
            raise proxy_error(
                dropped[1], 400, "invalid_value", param=f"messages[{dropped[0]}].role"
            )
        return template_kwargs(req.chat_template_kwargs, req.reasoning_effort, req.verbosity)

    async def _run_render(
        self,
        ex: Execution,
        body: bytes,
        req: ChatCompletionRequest,
        parent: Node | None,
        render: Callable[[], _T],
    ) -> _T:
        """`render()` on the event loop for a few new messages, in a worker thread for much text
        (a first call, a full re-render): rendering a few new messages takes microseconds, less
        than a thread hop; rendering and tokenizing much text must not block the loop. A
        template's own error is a 400."""
        if parent is None or self.renderer.check_due(ex.render):
            new_bytes = len(body)
        else:
            assert parent.messages is not None  # a chat call's node holds its messages
            added = req.messages[len(parent.messages) :]
            new_bytes = sum(len(message_text(m.content) or "") for m in added)
        try:
            if new_bytes <= _INLINE_RENDER_BYTES:
                return render()
            return await anyio.to_thread.run_sync(render)
        except Exception as exc:  # jinja raises its own errors for messages a template rejects
            if isinstance(exc, ProxyError):
                raise
            raise proxy_error(
                f"the chat template cannot render these messages: {exc}",
                400,
                "invalid_messages",
                param="messages",
            ) from None

    async def completion(
        self, ex: Execution, role: Role, prompt: str | list[int], req: CompletionRequest
    ) -> Call:
        """Tokenize a completions prompt (or take its token IDs) and start its `Call`."""
        started = time.time()
        engine = self.engine_for(ex.execution_id)
        structured = completion_constraint(req)
        if isinstance(prompt, str):
            special = req.add_special_tokens
            ids = await anyio.to_thread.run_sync(
                lambda: self.tokenizer.encode(prompt, add_special_tokens=special)
            )
        else:  # token IDs: checked here, at C speed, so the engine never refuses them
            vocab = engine.statistics().vocab_size
            if prompt and not (0 <= min(prompt) and max(prompt) < vocab):
                bad = next(t for t in prompt if not 0 <= t < vocab)
                raise proxy_error(
                    f"prompt must be token IDs in [0, {vocab}) ({bad} is not)",
                    400,
                    "invalid_value",
                    param="prompt",
                )
        ids = self.text.intern(ids if isinstance(prompt, str) else prompt)
        if not ids:
            raise proxy_error("prompt must not be empty", 400, "invalid_value", param="prompt")
        rendered = link_tokens(ex.render, ids, self.renderer.stats)
        return self._start(
            ex,
            engine=engine,
            role=role,
            started_s=started,
            rendered=rendered,
            req=req,
            max_tokens=req.max_tokens,
            prompt_len=len(ids),
            structured=structured,
            parse_tools=False,
            chat=False,
            template_kwargs=None,
        )

    def _start(
        self,
        ex: Execution,
        *,
        engine: InferenceEngine,
        role: Role,
        started_s: float,
        rendered: Rendered,
        req: ChatCompletionRequest | CompletionRequest,
        max_tokens: int | None,
        prompt_len: int,
        structured: StructuredOutput | None = None,
        parse_tools: bool,
        chat: bool = True,
        template_kwargs: dict[str, Any] | None,
    ) -> Call:
        """The tail both endpoints share: sampling params (the request's `max_tokens`, clamped to
        the context left after `prompt_len`, and the reply's grammar, `structured`), the
        closed-execution check, the `Call` (`parse_tools`, `chat`, `template_kwargs`: its
        fields). Raises what `sampling_params` and `_check_open` raise (400s, 409)."""
        sampling = sampling_params(
            req,
            max_tokens,
            prompt_len,
            ex,
            engine,
            config=self.config,
            stop_token_ids=self.stop_token_ids,
            structured=structured,
        )
        self._check_open(ex)
        return Call.start(
            ex,
            engine,
            role,
            started_s,
            rendered,
            sampling,
            stop_strings(req.stop),
            text=self.text,
            reply_parser=self.model_format.parser,
            tool_ids=self.model_format.tool_ids,
            parse_tools=parse_tools,
            chat=chat,
            template_kwargs=template_kwargs,
        )
