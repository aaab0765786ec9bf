"""The C library, loaded once per process (``libc``): a ``ctypes.CDLL`` made per call cost
~10 us each (a new function pointer class, a ``dlsym`` per name), several times per task
start in the launcher."""

from __future__ import annotations

import ctypes
import functools

__all__ = ["libc"]


@functools.cache
def libc() -> ctypes.CDLL:
    """The process's C library with ``use_errno`` (``ctypes.get_errno`` is per thread, so one
    object serves every thread) and ``syscall`` returning a C long."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    return lib
