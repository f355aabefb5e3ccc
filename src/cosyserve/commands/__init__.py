"""Subcommands of the `cosyserve` CLI that need more than a few lines."""
