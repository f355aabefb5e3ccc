"""Running out of accelerator memory: recognised, the allocator's cache freed, a typed error raised.

`torch.OutOfMemoryError` (what `torch.cuda.OutOfMemoryError` is) leaves the networks intact: the
allocation that failed never happened. So the engine frees the blocks the caching allocator holds and
answers the request concerned with `OutOfMemory` (the service turns it into a 503 with Retry-After),
and the next request runs normally.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from cosyserve.errors import OutOfMemory

log = logging.getLogger(__name__)

OOM_RETRY_AFTER_S = 5  # long enough for the requests holding memory to finish or stream on


def trim_heap() -> bool:
    """Hand the C heap's free memory back to the system (glibc's `malloc_trim(0)`); False where there
    is no such call. Freed tensors below glibc's mmap threshold stay in the heap otherwise, and count in
    the process's resident memory until something reuses them."""
    name = ctypes.util.find_library("c")
    try:
        trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return False
    if trim is None:
        return False
    trim(0)
    return True


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError)


def free_cached_memory() -> None:
    """Return the CUDA caching allocator's free blocks to the driver. A no-op where no CUDA context
    exists (it would create one); never raises (after a sticky CUDA error there is nothing to free)."""
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except RuntimeError as exc:
        log.warning("could not free the CUDA cache after running out of memory: %s", exc)


def out_of_memory(what: str, cause: BaseException) -> OutOfMemory:
    """The request-level error for an out-of-memory `cause` raised while doing `what`."""
    first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return OutOfMemory(
        f"the GPU ran out of memory during {what} ({first_line[:200]}); the engine freed its cache and "
        f"keeps serving: retry in {OOM_RETRY_AFTER_S} s, or send shorter text",
        retry_after_s=OOM_RETRY_AFTER_S,
    )


@contextmanager
def out_of_memory_as_error(what: str) -> Iterator[None]:
    """Turn an out-of-memory error inside the block into `OutOfMemory`, the cache freed first."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        free_cached_memory()
        raise out_of_memory(what, exc) from exc
