"""gyre.rl (see DESIGN.md)."""
