"""gyre.tasks (see DESIGN.md)."""
