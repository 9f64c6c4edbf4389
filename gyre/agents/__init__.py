"""gyre.agents (see DESIGN.md)."""
