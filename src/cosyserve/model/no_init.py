"""Building modules without their default random initialisation, for weights that are filled next."""

from __future__ import annotations

from torch.overrides import TorchFunctionMode


class NoRandomInit(TorchFunctionMode):
    """Skips every `torch.nn.init` call (what `reset_parameters` uses), so parameters stay uninitialised;
    buffers computed in constructors (rotary tables, windows) are still computed. Use as a context
    manager around construction, then fill every parameter."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else None
        return func(*args, **(kwargs or {}))
