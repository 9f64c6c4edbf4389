"""Fixtures: the scripted OpenAI server with its control bridge, and a harness pointed at it."""

from __future__ import annotations

import pytest

from gyre.agents.harness import Harness
from tests.agents.openai_server import ControlBridge, ScriptedOpenAI


@pytest.fixture
def server():
    s = ScriptedOpenAI()
    yield s
    s.close()


@pytest.fixture
def bridge(server):
    b = ControlBridge()
    b.attach(server)
    return b


@pytest.fixture
def harness(server, tmp_path):
    return Harness(
        base_url=server.base_url, workspace_root=tmp_path / "executions", kill_grace_s=0.5
    )
