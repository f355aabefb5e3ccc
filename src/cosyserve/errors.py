"""Errors that reach users. Each message says what was wrong and what to do about it."""

from __future__ import annotations


class CosyServeError(Exception):
    """Base class for every error cosyserve raises on purpose (never for bugs)."""


class ModelDirError(CosyServeError):
    """A model directory is missing, incomplete, corrupt or of an unsupported kind."""


class ConfigError(CosyServeError):
    """A model config file could not be read or lacks a required value."""


class CheckpointError(CosyServeError):
    """A state dict does not match the architecture its config describes."""


class InputError(CosyServeError):
    """Input that a user supplied (text, audio, parameters) cannot be used."""
