"""frontend layer (see DESIGN.md)."""
