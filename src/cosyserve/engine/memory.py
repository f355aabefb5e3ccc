"""Running out of memory: recognised, the allocator's cache freed, a typed error raised.

`torch.OutOfMemoryError` (what `torch.cuda.OutOfMemoryError` is) leaves the networks intact: the
allocation that failed never happened. So the engine frees the blocks the caching allocator holds and
answers the request concerned with `OutOfMemory` (the service turns it into a 503 with Retry-After),
and the next request runs normally. The same holds for the host's memory (`MemoryError`) and for
onnxruntime's prompt models, whose allocation failures come as RUNTIME_EXCEPTION text
(`errors.is_out_of_memory` recognises them all).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from cosyserve.errors import OutOfMemory
from cosyserve.errors import is_out_of_memory as _is_out_of_memory

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
    return _is_out_of_memory(exc)


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
    where = "GPU" if isinstance(cause, torch.OutOfMemoryError) or "cuda" in str(cause).lower() else "server"
    return OutOfMemory(
        f"the {where} ran out of memory during {what} ({first_line[:200]}); the engine freed its cache and "
        f"keeps serving: retry in {OOM_RETRY_AFTER_S} s, or send shorter text",
        retry_after_s=OOM_RETRY_AFTER_S,
    )


@contextmanager
def out_of_memory_as_error(what: str) -> Iterator[None]:
    """Turn an out-of-memory error inside the block into `OutOfMemory`, the cache freed first (one
    raised already passes unchanged)."""
    try:
        yield
    except OutOfMemory:
        raise
    except Exception as exc:  # MemoryError and onnxruntime's errors are no torch.OutOfMemoryError
        if not is_out_of_memory(exc):
            raise
        free_cached_memory()
        raise out_of_memory(what, exc) from exc
