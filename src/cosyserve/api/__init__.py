"""api layer (see DESIGN.md)."""
