"""Model directories: the official layout and its checks, downloading from the model hubs, resolving a
model setting (hub id, path or `demo`) to a directory, and the random-weight demo model. Tooling around
the checkpoints; nothing here runs inference (see DESIGN.md)."""
