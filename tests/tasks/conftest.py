"""Fixtures shared with tests/agents: the scripted OpenAI server, control bridge and harness."""

from tests.agents.conftest import bridge, harness, server  # noqa: F401
