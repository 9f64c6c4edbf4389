"""gyre.tito (see DESIGN.md)."""
