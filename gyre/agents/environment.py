"""An agent process's environment: what it is given, and nothing else of the node's.

Owns `agent_environment`, `anthropic_base_url`, `AGENT_DEFAULTS` and `NODE_PASSTHROUGH`. In
order of precedence (later wins): the node's PATH, LANG, LC_ALL, TZ and the names of
`[tasks.harness] env_passthrough`; gyre's defaults for well-known agents (`AGENT_DEFAULTS`:
mini-swe-agent and litellm pointed at the proxy); the user's `[tasks.harness] env`; then what
gyre sets for the execution (`gyre.config.agents.AGENT_ENV_OWNED`, `GYRE_*`): the proxy's
address and the execution's key for OpenAI and Anthropic clients, and the served model name.
The harness adds the execution's folders (HOME, TMPDIR, GYRE_WORKSPACE, ...). Knows nothing
about processes, HTTP or the proxy but its URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from gyre.config.agents import AGENT_ENV_OWNED

__all__ = ["agent_environment", "anthropic_base_url", "AGENT_DEFAULTS", "NODE_PASSTHROUGH"]

NODE_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "TZ")
"""The node's variables every agent gets (when the node has them)."""

AGENT_DEFAULTS = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "PYTHONUNBUFFERED": "1",
}
"""Defaults `[tasks.harness] env` may replace. mini-swe-agent's `mini` prompts for a setup on
the terminal unless `MSWEA_CONFIGURED` is set, and raises on a model litellm has no
price for unless `MSWEA_COST_TRACKING=ignore_errors` (its `LitellmModelConfig.cost_tracking`);
litellm fetches its price list from the internet at import unless
`LITELLM_LOCAL_MODEL_COST_MAP` is set, and an agent's network reaches only the proxy.
`MSWEA_MODEL_NAME` (mini-swe-agent's model when none is configured) is added as
`openai/<model>`: litellm's OpenAI provider, which reads `OPENAI_BASE_URL`; and
`OPENAI_DEFAULT_MODEL` as `<model>`: the OpenAI Agents SDK's model when an agent names none
(`agents.models.get_default_model`; otherwise its own default, a name the proxy refuses, with
that model's default settings). The SDK lower-cases it, so a served name with capitals needs a
lower-case alias (`[proxy] model_aliases`)."""


def anthropic_base_url(base_url: str) -> str:
    """The Anthropic SDKs' base URL for the proxy at `base_url` (`.../v1`): they append
    `/v1/messages` themselves (anthropic-sdk-python `resources/messages`), so a trailing `/v1`
    is dropped; any other URL is returned as it is."""
    trimmed = base_url.rstrip("/")
    return trimmed[: -len("/v1")] if trimmed.endswith("/v1") else trimmed


def agent_environment(
    *,
    base_url: str,
    api_key: str,
    model: str,
    env: Mapping[str, str] | None = None,
    passthrough: Sequence[str] = (),
    node_env: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The environment of one agent process before its folders are added.

    `base_url`: the proxy as the agent reaches it (`http://host:port/v1`); `api_key`: the
    execution's key; `model`: the served model name (`proxy.model_name`); `env` and
    `passthrough`: `[tasks.harness] env` and `env_passthrough` (checked by
    `gyre.config.agents.check_agent_env`); `node_env`: the node's environment. Sets
    OPENAI_BASE_URL and OPENAI_API_BASE to `base_url`, ANTHROPIC_BASE_URL to
    `anthropic_base_url(base_url)`, OPENAI_API_KEY and ANTHROPIC_API_KEY to `api_key`,
    OPENAI_MODEL, ANTHROPIC_MODEL and GYRE_MODEL to `model`. Raises `AssertionError` if `env`
    names one of those (the config refuses it first)."""
    env = env or {}
    assert not (set(env) & AGENT_ENV_OWNED), sorted(set(env) & AGENT_ENV_OWNED)
    out = {k: node_env[k] for k in (*NODE_PASSTHROUGH, *passthrough) if k in node_env}
    out.update(AGENT_DEFAULTS, MSWEA_MODEL_NAME=f"openai/{model}", OPENAI_DEFAULT_MODEL=model)
    out.update(env)
    out.update(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_BASE=base_url,
        OPENAI_API_KEY=api_key,
        OPENAI_MODEL=model,
        ANTHROPIC_BASE_URL=anthropic_base_url(base_url),
        ANTHROPIC_API_KEY=api_key,
        ANTHROPIC_MODEL=model,
        GYRE_MODEL=model,
    )
    return out
