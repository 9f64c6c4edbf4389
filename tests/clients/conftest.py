"""Fixtures of the real-client tests: the tiny tokenizer of the proxy tests."""

from tests.tito.conftest import tok  # noqa: F401 (a fixture, used by name)
