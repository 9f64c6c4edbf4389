"""gyre.trajectory (see DESIGN.md)."""
