"""Linear layers on reordered weights while sampling on a CPU.

A decode step multiplies a few dozen rows (the batch's new tokens) by every
weight matrix of the model. At so few rows ``F.linear`` on an x86 CPU runs far
below the machine's limits: on a 2-core AVX2 EPYC (2026-12-04, two threads)
SmolLM2-135M's 210 decoder products at 16 rows took 73 ms and its output layer
55 ms, against 62 ms and 14 ms with the same weights reordered once into
oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``). The values agree with
``F.linear``'s to fp32 rounding (logits 2-3e-6 apart at SmolLM2's scale); the
trainer's log-probs are still computed by ``F.linear``.

:func:`packed_linears` reorders the weights (about 0.3 s for SmolLM2's 135M
on 2 threads) at the first turn of a step's sampling or of an evaluation, and
while it lasts every ``nn.Linear`` of the model and
:func:`grpo.sampling.forward.head_logits` use the copies. Only where it is safe: fp32
weights on an x86 CPU with oneDNN and more than one thread, plain tensors (FSDP's shards are not; the
whole weights it gathers for sampling are, a full copy in every process), on
the main thread (with ``--async-lag`` the sampling thread keeps ``F.linear``),
and per call only with gradients off and outside autocast. No scope spans a
change of the weights (an optimiser step, a checkpoint's load, a push): each
ends with the sampling or evaluation it serves. As a guard, a weight changed in
place since it was reordered falls back to ``F.linear``; an assignment to
``.data`` or FSDP's refill of its gathered weights is not seen by that guard.
The copies cost memory the size of the weights while they last (grpo/run/memory.py
counts them in the sampling phases). ``GRPO_REORDERED_WEIGHTS=0`` turns it off.
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386", "x86")
LAYOUT_ROWS = 16  # the batch the reordered layout is tuned for; any batch runs on it

_packed: dict[int, tuple[Tensor, int, Tensor]] = {}  # id(weight) -> (weight, its version then, the copy)
_scope: dict = {"depth": 0, "pending": (), "layers": []}  # the main thread's open scopes, their layers


def onednn_here() -> bool:
    """Whether this CPU can sample on reordered weights: x86, oneDNN on and computing fp32 in fp32, and not
    turned off (``GRPO_REORDERED_WEIGHTS=0``)."""
    precision = getattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision", "none")
    return (X86 and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
            and precision in ("none", "ieee") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and os.environ.get("GRPO_REORDERED_WEIGHTS", "1") != "0")


def packs_here() -> bool:
    """Whether sampling reorders its weights: :func:`onednn_here`, on more than one thread. On one thread
    (2026-12-04, 16 rows x 48 tokens, three alternating pairs) the own engine's generate took 1.026x its
    time with the reordering: no gain, so none."""
    return onednn_here() and torch.get_num_threads() > 1


def can_pack(weight: Tensor) -> bool:
    """Whether ``weight`` may be reordered: fp32, 2-D, a plain tensor on an x86 CPU with oneDNN."""
    return (
        packs_here()
        and type(weight) in (Tensor, nn.Parameter)
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
    )


def reordered(weight: Tensor) -> Tensor | None:
    """The open scope's reordered copy of ``weight``, if it holds one for this weight at its current version
    and this call records no gradient and runs outside CPU autocast; else None."""
    entry = _packed.get(id(weight))
    if (entry is None or entry[0] is not weight or entry[1] != weight._version or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")):
        return None
    return entry[2]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, on the reordered copy of ``weight`` where there is one (fp32 input)."""
    copy = reordered(weight)
    if copy is None or x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, copy, bias, "none", [], "")


def _forward_of(module: nn.Linear) -> Callable[[Tensor], Tensor]:
    def forward(input: Tensor) -> Tensor:  # nn.Linear.forward's signature  # noqa: A002
        return linear(input, module.weight, module.bias)
    return forward


@contextmanager
def packed_linears(*modules: nn.Module, lazy: bool = False) -> Iterator[None]:
    """While inside, the ``nn.Linear`` layers of ``modules`` that :func:`can_pack` run on reordered copies of
    their weights (as does :func:`linear` on those weights: the fp32 output layer). For sampling: weights
    that change inside fall back to ``F.linear``. ``lazy``: reorder only when a scope inside this one
    opens (a turn of sampling), so the cost falls in the generation time that pays for it and nothing is
    spent where nothing is sampled (a step sampled by vLLM). Scopes inside one another share one
    reordering, released when the outermost closes. Off the main thread: nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost = _scope["depth"] == 0
    _scope["depth"] += 1
    try:
        _scope["pending"] = (*_scope["pending"], *modules)
        if not lazy:
            _reorder(_scope["pending"])
            _scope["pending"] = ()
        yield
    finally:
        _scope["depth"] -= 1
        if outermost:
            for layer in _scope["layers"]:
                layer.__dict__.pop("forward", None)
            _scope.update(pending=(), layers=[])
            _packed.clear()


def _reorder(modules: tuple[nn.Module, ...]) -> None:
    """Reorder the weights of ``modules``' linear layers not yet reordered, and route their forward to them."""
    layers = [m for root in modules for m in root.modules()  # a subclass's own forward, or one already
              # replaced on the instance (accelerate's hooks, an open scope's), is left alone
              if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward and can_pack(m.weight)
              and "forward" not in m.__dict__]
    with torch.no_grad():
        for layer in layers:
            w = layer.weight
            if id(w) not in _packed:  # tied weights are reordered once
                _packed[id(w)] = (w, w._version, torch.ops.mkldnn._reorder_linear_weight(w.detach(), LAYOUT_ROWS))
            _scope["layers"].append(layer)  # recorded before it is patched: always undone
            layer.forward = _forward_of(layer)
