"""The device contract (grpo/learning/update.py): group bookkeeping on the CPU, per-token tensors on the
policy's device. This CPU build has no CUDA, so ``OnDevice`` stands for a tensor on the GPU: it
computes on the CPU and raises where a CPU tensor and a device tensor meet in one operation, as
CUDA does when a CPU tensor is indexed with a GPU mask."""

import pytest
import torch
import torch.utils._pytree as pytree

from grpo.learning.update import trained_groups


class OnDevice(torch.Tensor):
    """A tensor that behaves as if it lived on the accelerator: results computed from it stay there
    until ``.cpu()``, and indexing a CPU tensor with it raises CUDA's error."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__getitem__ and not isinstance(args[0], OnDevice):
                index = args[1] if isinstance(args[1], tuple) else (args[1],)
                if any(isinstance(i, OnDevice) for i in index):
                    raise RuntimeError("indices should be either on cpu or on the same device as the indexed "
                                       "tensor (cpu)")
            out = func(*args, **kwargs)
            to_cpu = func is torch.Tensor.cpu or (func is torch.Tensor.to and "cpu" in map(str, args[1:]))
            inputs = pytree.tree_leaves((args, kwargs))
            if to_cpu:  # on the CPU already, .cpu() returns its input: a plain tensor, as from a real copy
                return out.as_subclass(torch.Tensor)
            if not any(isinstance(a, OnDevice) for a in inputs):
                return out
            return pytree.tree_map(lambda t: t.as_subclass(OnDevice) if isinstance(t, torch.Tensor) else t, out)


def on_device(t: torch.Tensor) -> OnDevice:
    return t.as_subclass(OnDevice)


def test_the_stand_in_raises_where_cuda_does():
    minibatch = torch.tensor([1, 0])
    mask = on_device(torch.tensor([True, False]))
    with pytest.raises(RuntimeError, match="same device"):
        minibatch[mask]  # the line that crashed the first update on a GPU (issue 28)


def test_trained_groups_takes_advantages_on_the_device():
    advantages = on_device(torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 2.0, -2.0]))  # (B*G,) B=4, G=2
    minibatch = torch.tensor([3, 0, 1])
    todo = trained_groups(minibatch, advantages, group_size=2, skip_zero=True)
    assert not isinstance(todo, OnDevice) and todo.tolist() == [3, 1]  # group 0 has zero advantages
    assert trained_groups(minibatch, advantages, group_size=2, skip_zero=False).tolist() == [3, 0, 1]
