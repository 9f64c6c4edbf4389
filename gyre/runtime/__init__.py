"""gyre.runtime (see DESIGN.md)."""
