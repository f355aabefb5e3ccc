"""service layer (see DESIGN.md)."""
