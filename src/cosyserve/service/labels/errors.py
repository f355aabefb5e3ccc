"""What labelling and verifying can fail with."""

from __future__ import annotations

from cosyserve.errors import InputError


class LabelFormatError(InputError):
    """The bytes are not a file of the format they were taken for, or its header is incomplete."""
