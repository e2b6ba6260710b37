"""Give back what the allocator holds free, once the bench is over and the days of the run
phase begin.

The phases before the run phase leave the C heap with free space the allocator keeps for later
(the proofs' inputs and answers, gRPC's buffers, the bound verdict's samples): glibc returns
only what lies at the top of its heap by itself. glibc's ``malloc_trim(0)`` returns every free
page it can (bench/run.py: 1.6 MiB of the supervisor's RSS in the run phase); without it (musl)
only the garbage collection is done.
"""

from __future__ import annotations

import ctypes
import gc


def release_free_memory() -> None:
    """Collect garbage, then return the C heap's free pages to the system where glibc can."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim  # this process's own symbols: glibc's, if any
    except (AttributeError, OSError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
