"""Random streams keyed by what is sampled, not by who samples it.

Every sampled completion has a key made of what identifies it in the run
(the seed, the step, the generation round, its row in the round's global
draw); the uniform number that picks its token at position t is a hash of
(key, t). So the same completion draws the same numbers whichever process
samples it, in whatever batch, and two completions never share a stream:
a run on N processes samples what one process would, and its groups are as
independent as one process's.

The hash is counter-based (no state to carry or checkpoint) and runs on
int64 tensors on any device. Its mixer is Chris Wellons' "lowbias32"
(https://nullprogram.com/blog/2018/07/31/), on 32-bit values held in int64
so that no product overflows; a key is two such lanes hashed with
different salts, so two keys collide with probability about 2^-64.
"""

from __future__ import annotations

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
_SALTS = (0x9E3779B9, 0x85EBCA6B)  # one per lane of a key
_SEED_AT = 0xC2B2AE35  # the counter a stream's seed is hashed at: a token index no completion reaches


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32), in two 16-bit halves so that int64 never overflows."""
    hi, lo = x >> 16, x & 0xFFFF
    return ((((hi * c) & 0xFFFF) << 16) + lo * c) & _M32


def _mix(x: Tensor) -> Tensor:
    """lowbias32: a bijection of [0, 2^32) in which every input bit flips each output bit about half the time."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_keys(*parts: int | Tensor) -> Tensor:
    """Keys (n, 2) of the streams named by ``parts``: ints (the same for every row) and (n,) tensors.

    ``stream_keys(seed, step, round, rows)`` gives row i the stream of
    (seed, step, round, rows[i]). Each part must lie in [0, 2^32).
    """
    rows = next((p for p in parts if isinstance(p, Tensor)), None)
    if rows is None:
        raise ValueError("stream_keys needs at least one tensor part (the rows)")
    lanes = []
    for salt in _SALTS:
        h = torch.full(rows.shape, salt, dtype=torch.long, device=rows.device)
        for part in parts:
            value = part.long() if isinstance(part, Tensor) else torch.tensor(part, device=rows.device)
            h = _mix(h ^ _mix((value & _M32) ^ salt))
        lanes.append(h)
    return torch.stack(lanes, dim=1)  # (n, 2)


def _hash(keys: Tensor, at: Tensor) -> Tensor:
    """Each stream's 32-bit hash at counter ``at`` (n,): keys (n, 2) -> (n,) int64."""
    h = _mix(keys[:, 0] ^ _mix(at))
    return _mix(h ^ keys[:, 1])


def stream_uniforms(keys: Tensor, position: int | Tensor) -> Tensor:
    """Each stream's uniform number in [0, 1) at ``position`` (a token index, or one per stream (n,)):
    keys (n, 2) -> (n,) float32.

    24 bits, the resolution of ``torch.rand`` in float32.
    """
    if isinstance(position, Tensor):
        at = position.to(keys.dtype) & _M32
    else:
        at = torch.full_like(keys[:, 0], position & _M32)
    return (_hash(keys, at) >> 8).float() * (1.0 / (1 << 24))


def stream_seeds(keys: Tensor) -> list[int]:
    """An integer seed in [0, 2^32) for each stream: keys (n, 2) -> n ints.

    What an environment's reset is given (grpo/sampling/episodes.py): a group's seed is
    its first episode's stream hashed at a counter no completion reaches
    (_SEED_AT, past 2^31 tokens), so it is none of the numbers its tokens draw
    and the same on a rerun and on any number of processes. 32 bits, because
    every seeding API takes that (``random.seed``, ``numpy.random.seed``,
    ``torch.manual_seed``).
    """
    return _hash(keys, torch.full_like(keys[:, 0], _SEED_AT)).tolist()
