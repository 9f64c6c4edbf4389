"""gyre.sim (see DESIGN.md)."""
