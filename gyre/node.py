"""`python -m gyre.node --config FILE`: one node's entry point (grows with the runtime)."""

from __future__ import annotations

from gyre.config import RunConfig

__all__ = ["run", "main"]


def run(config: RunConfig) -> None:
    """Run one node's job described by `config`."""
    raise NotImplementedError("the node's job lands with issue 2's engine work")


def main(argv: list[str] | None = None) -> int:
    raise NotImplementedError
