"""What an agent process sees of its environment: the proxy for OpenAI, Anthropic and litellm
clients with a model name they can use, `[tasks.harness] env` and `env_passthrough`, and nothing
else of the node's (`gyre.agents.environment`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gyre.agents.environment import AGENT_DEFAULTS, agent_environment, anthropic_base_url
from gyre.agents.harness import Harness
from gyre.config import HarnessConfig
from tests.agents.test_harness import out_task

DUMP_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def test_anthropic_base_url_drops_the_v1_the_sdk_adds() -> None:
    assert anthropic_base_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert anthropic_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert anthropic_base_url("http://gw.example/proxy") == "http://gw.example/proxy"


def test_agent_environment_layers_node_defaults_user_and_gyre() -> None:
    node = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "GYRE_CELL_SECRET": "s3cret",
        "AWS_SECRET_ACCESS_KEY": "nope",
        "HF_TOKEN": "hf_x",
    }
    env = agent_environment(
        base_url="http://127.0.0.1:9/v1",
        api_key="gyre-e1-abc",
        model="qwen",
        env={"MSWEA_MODEL_NAME": "hosted_vllm/qwen", "PATH": "/opt/tools:/bin", "X": "1"},
        passthrough=("HF_TOKEN", "NOT_ON_NODE"),
        node_env=node,
    )
    assert env == {
        "PATH": "/opt/tools:/bin",  # the user's value replaces the node's
        "LANG": "C.UTF-8",
        "HF_TOKEN": "hf_x",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONUNBUFFERED": "1",
        "MSWEA_MODEL_NAME": "hosted_vllm/qwen",  # the user's replaces gyre's default
        "OPENAI_DEFAULT_MODEL": "qwen",  # the OpenAI Agents SDK's model when none is named
        "X": "1",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_BASE": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "gyre-e1-abc",
        "OPENAI_MODEL": "qwen",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "ANTHROPIC_API_KEY": "gyre-e1-abc",
        "ANTHROPIC_MODEL": "qwen",
        "GYRE_MODEL": "qwen",
    }
    default = agent_environment(base_url="http://h/v1", api_key="k", model="gyre", node_env={})
    assert default["MSWEA_MODEL_NAME"] == "openai/gyre"
    assert default["OPENAI_DEFAULT_MODEL"] == "gyre"


def test_the_agents_sdk_default_model_is_the_served_one(monkeypatch) -> None:
    """An OpenAI Agents SDK agent that names no model uses `OPENAI_DEFAULT_MODEL`; without it the
    SDK asks for its own default (a name the proxy refuses, with reasoning settings for it)."""
    models = pytest.importorskip("agents.models", reason="openai-agents is a [test] dependency")
    monkeypatch.delenv("OPENAI_DEFAULT_MODEL", raising=False)
    assert models.get_default_model() != "gyre"
    env = agent_environment(base_url="http://h/v1", api_key="k", model="gyre", node_env={})
    monkeypatch.setenv("OPENAI_DEFAULT_MODEL", env["OPENAI_DEFAULT_MODEL"])
    assert models.get_default_model() == "gyre"
    assert models.get_default_model_settings().reasoning is None


@pytest.mark.parametrize(
    ("env", "passthrough", "message"),
    [
        ({"OPENAI_BASE_URL": "http://elsewhere"}, (), "env: 'OPENAI_BASE_URL' is set by gyre"),
        ({"ANTHROPIC_API_KEY": "sk"}, (), "env: 'ANTHROPIC_API_KEY' is set by gyre"),
        ({"HOME": "/root"}, (), "env: 'HOME' is set by gyre"),
        ({"GYRE_MODEL": "x"}, (), "env: 'GYRE_MODEL' is set by gyre"),
        ({}, ("GYRE_NODE_SECRET",), "env_passthrough: 'GYRE_NODE_SECRET' is set by gyre"),
        ({}, ("OPENAI_API_KEY",), "env_passthrough: 'OPENAI_API_KEY' is set by gyre"),
        ({"1X": "v"}, (), "env: '1X' is not an environment variable name"),
        ({"X": "a\0b"}, (), "env: the value of 'X' holds a NUL byte"),
    ],
)
def test_env_that_overrides_gyre_is_refused(tmp_path, env, passthrough, message) -> None:
    with pytest.raises(ValueError, match=message):
        HarnessConfig(env=env, env_passthrough=passthrough)
    with pytest.raises(ValueError, match=message):
        Harness(
            base_url="http://127.0.0.1:9/v1",
            workspace_root=tmp_path,
            env=env,
            env_passthrough=passthrough,
        )


@pytest.mark.anyio
async def test_agent_sees_exactly_its_environment(
    tmp_path: Path, server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `Harness.from_config` and a real agent process: gyre's variables, the config's
    `env`, the passed-through names, and no other variable of the node."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("HF_TOKEN", "hf_from_node")
    monkeypatch.setenv("GYRE_NODE_SECRET", "do-not-leak")
    monkeypatch.setenv("SOME_NODE_VARIABLE", "do-not-leak")
    monkeypatch.setenv("LANG", "C.UTF-8")  # unset, Python itself would add LC_CTYPE (PEP 538)
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.delenv("TZ", raising=False)
    config = HarnessConfig(
        env={"MSWEA_MODEL_NAME": "openai/tiny", "PROVIDER_REGION": "eu"},
        env_passthrough=("HF_TOKEN",),
        isolate_network=False,  # the test reads the address it gave, unrelayed
        require_isolation=False,
    )
    harness = Harness.from_config(
        config, base_url=server.base_url, model="tiny", run_dir=tmp_path / "run"
    )
    outcome = await harness.run(
        out_task(tmp_path), "env-1", agent_command=[sys.executable, "-c", DUMP_ENV]
    )
    seen = json.loads(outcome.stdout_tail.strip().splitlines()[-1])
    exec_dir = harness.execution_dir("env-1")
    assert seen.pop("OPENAI_API_KEY").startswith("gyre-env-1-")
    assert seen.pop("ANTHROPIC_API_KEY").startswith("gyre-env-1-")
    base = server.base_url
    assert seen == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HF_TOKEN": "hf_from_node",
        **AGENT_DEFAULTS,
        "MSWEA_MODEL_NAME": "openai/tiny",
        "OPENAI_DEFAULT_MODEL": "tiny",
        "PROVIDER_REGION": "eu",
        "OPENAI_BASE_URL": base,
        "OPENAI_API_BASE": base,
        "OPENAI_MODEL": "tiny",
        "ANTHROPIC_BASE_URL": base.removesuffix("/v1"),
        "ANTHROPIC_MODEL": "tiny",
        "GYRE_MODEL": "tiny",
        "HOME": str(exec_dir / "home"),
        "TMPDIR": str(exec_dir / "tmp"),
        "GYRE_EXECUTION_ID": "env-1",
        "GYRE_WORKSPACE": str(exec_dir / "workspace"),
        "GYRE_INSTRUCTION_FILE": str(exec_dir / "instruction.md"),
    }
