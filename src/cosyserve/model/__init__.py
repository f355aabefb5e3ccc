"""model layer (see DESIGN.md)."""
