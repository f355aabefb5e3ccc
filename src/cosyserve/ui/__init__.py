"""ui layer (see DESIGN.md)."""
