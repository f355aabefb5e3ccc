"""Loading the official state dicts safely and strictly.

`torch.load(weights_only=True, mmap=True)` never runs pickled code (torch >= 2.6) and maps the file
instead of reading a second copy into memory. Weight norm is folded into plain weights: inference
never needs the g/v split, and both layouts the official checkpoints use are accepted.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from cosyserve.errors import CheckpointError

_PARAMETRIZED = ".parametrizations.weight.original"  # torch.nn.utils.parametrizations.weight_norm
_LEGACY_G, _LEGACY_V = ".weight_g", ".weight_v"  # torch.nn.utils.weight_norm (older checkpoints)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Memory-map a `.pt` state dict. Raises CheckpointError on a truncated or foreign file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} does not exist") from exc
    except (RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"{path.name} cannot be read as a PyTorch state dict ({str(exc).splitlines()[0]}); "
            "the file is probably truncated or corrupt: download it again with `cosyserve download`"
        ) from exc
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name} is not a plain state dict of tensors")
    return dict(state)


def _weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w = g * v / ||v||, the norm taken over every dim but 0 (torch's default `dim=0`)."""
    dims = tuple(range(1, v.dim()))
    return v * (g / v.norm(p=2, dim=dims, keepdim=True))


def fold_weight_norm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace g/v weight-norm pairs (either layout) by the plain `.weight` they define."""
    folded: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        if _PARAMETRIZED in key:
            prefix, index = key.rsplit(_PARAMETRIZED, 1)
            pairs.setdefault(prefix, {})["g" if index == "0" else "v"] = tensor
        elif key.endswith((_LEGACY_G, _LEGACY_V)):
            pairs.setdefault(key[:-9], {})["g" if key.endswith(_LEGACY_G) else "v"] = tensor
        else:
            folded[key] = tensor
    for prefix, pair in pairs.items():
        if set(pair) != {"g", "v"}:
            raise CheckpointError(f"weight norm of {prefix} is incomplete: only {sorted(pair)} present")
        folded[f"{prefix}.weight"] = _weight_norm(pair["g"].float(), pair["v"].float()).to(pair["v"].dtype)
    return folded


def load_into(
    module: nn.Module, state: Mapping[str, torch.Tensor], checkpoint_name: str, *, assign: bool = True
) -> None:
    """Load `state` into `module`, strictly: every mismatch is listed in one CheckpointError.

    With `assign` (default) the module takes the (memory-mapped) tensors themselves instead of
    copying them, so the weights exist once in memory.
    """
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = sorted(
        f"{key} (checkpoint {tuple(state[key].shape)}, model {tuple(expected[key].shape)})"
        for key in set(expected) & set(state)
        if state[key].shape != expected[key].shape
    )
    if missing or unexpected or misshaped:
        lines = [f"{checkpoint_name} does not match the architecture in cosyvoice3.yaml:"]
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)):
            if keys:
                shown = ", ".join(keys[:12]) + (f", … ({len(keys) - 12} more)" if len(keys) > 12 else "")
                lines.append(f"  {label}: {shown}")
        lines.append("  check that the YAML and the weights come from the same model download")
        raise CheckpointError("\n".join(lines))
    module.load_state_dict(state, strict=True, assign=assign)
