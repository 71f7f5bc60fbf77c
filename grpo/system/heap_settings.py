"""glibc's heap settings: freed blocks go back to the system at once, except while sampling.

A training step frees and allocates activations of many sizes; kept for reuse,
those blocks fragment and add hundreds of MB to the peak, so a training process
has glibc return freed blocks of ``heap_release_mb`` MiB and more at once
(:func:`release_freed_memory`). Sampling is the other way round: each decode step
allocates and frees the same few dozen blocks of a few MB (every layer's key and
value cache, grown by one token, the logits and their softmax), and a block
returned to the system at once comes back as fresh pages, each one a page fault
when it is first written. :func:`reuse_freed_memory` keeps freed blocks in the
heap for the length of a turn, then hands the free memory back; the values
computed are the same, only where they live changes.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # mallopt parameters (malloc.h)
DEFAULT_TOP_PAD = 128 << 10  # glibc's M_TOP_PAD, which glibc never changes by itself
SAMPLING_MMAP_THRESHOLD = 32 << 20  # the largest threshold every 64-bit glibc accepts
SAMPLING_TOP_PAD = 64 << 20  # free memory kept at the heap's top instead of trimmed

_released = {"mib": 0, "depth": 0}  # mib: what release_freed_memory set (0: glibc's own); depth: scopes open


def _libc() -> ctypes.CDLL | None:
    """glibc, or None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 (both must exist: glibc, not another libc)
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_memory(mib: int) -> None:
    """Have glibc return freed blocks of at least ``mib`` MiB to the system at once.

    By default glibc raises that threshold as blocks are freed, up to 32 MiB,
    and keeps smaller freed blocks for reuse; a training step frees and
    allocates activations of many sizes, so the kept blocks fragment and add
    hundreds of MB to the peak. A no-op for ``mib`` <= 0, off Linux or without glibc.
    """
    libc = _libc()
    if mib <= 0 or libc is None:
        return
    libc.mallopt(M_MMAP_THRESHOLD, mib << 20)  # setting it also stops glibc adjusting it
    _released["mib"] = mib


@contextmanager
def reuse_freed_memory() -> Iterator[None]:
    """While inside, blocks up to 32 MiB are freed into the heap and reused, and the heap's top is not
    trimmed below 64 MiB; on leaving, the settings of :func:`release_freed_memory` come back and the
    heap's free memory is returned (``malloc_trim``).

    Only where :func:`release_freed_memory` set a threshold (otherwise glibc already reuses freed
    blocks), and only on the main thread: with ``--async-lag`` the sampling thread runs beside the
    update, whose blocks must still go back at once.
    """
    libc = _libc()
    mib = _released["mib"]
    if not mib or libc is None or _released["depth"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    _released["depth"] += 1
    libc.mallopt(M_MMAP_THRESHOLD, SAMPLING_MMAP_THRESHOLD)
    libc.mallopt(M_TOP_PAD, SAMPLING_TOP_PAD)
    try:
        yield
    finally:
        _released["depth"] -= 1
        libc.mallopt(M_MMAP_THRESHOLD, mib << 20)
        libc.mallopt(M_TOP_PAD, DEFAULT_TOP_PAD)
        libc.malloc_trim(0)
