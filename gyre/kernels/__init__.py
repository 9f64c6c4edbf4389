"""gyre.kernels (see DESIGN.md)."""
