"""gyre.model (see DESIGN.md)."""
