"""Data-parallel GRPO on torch.distributed: process groups, sharding, reductions.

Launch with ``torchrun --nproc-per-node N -m grpo train ...`` (or the
shortcut ``grpo train --nproc N``, grpo/system/launcher.py); a plain ``grpo train`` is a world of one
and every helper here is then a no-op.

How a step is split so that the update does not depend on the world size W:

- Every rank draws the same prompts (same seed, same ``prompt_rng``) and
  samples ``World.split`` of them as whole groups, so each group's G
  completions live on one rank. Completion j of a draw samples from the
  random stream of (seed, step, round, j) (grpo/sampling/random_streams.py), so the global
  batch is the one a single process samples, and no two ranks share a stream.
- Rewards are all-gathered: advantages (``scale="batch"`` included), the
  choice of groups to skip and the reward metrics are the whole batch's.
- With filter_groups the informative groups are counted over the whole
  draw; the first B are the batch, and each rank trains ``World.split`` of
  them (the ranks that sampled them send them over).
- The loss normaliser (valid tokens, or sequences) is the whole batch's, so
  each rank's loss is its exact share of the full-batch loss and the
  full-batch gradient is the SUM of the ranks' gradients.

Gradients are summed by hand (one flat all-reduce before the optimiser step)
rather than by wrapping the model in DistributedDataParallel: DDP averages
(it would need a factor W), its hooks fire only through ``module.forward``,
which the shared-prefix pass bypasses (it calls the decoder and the output
layer directly), and it expects every rank to run the same backward passes,
whereas a rank may have no informative group to train on in a minibatch.

With ``fsdp`` the parameters, gradients and optimiser state are sharded with
FSDP2 (``fully_shard``): one unit per decoder layer, resharded after its
forward, then the root (embeddings, final norm, output layer), with
gradients summed (divide factor 1). The policy is called through
:class:`ModelCalls`: with grad through its ``forward``, which runs any function
of the model under the root unit; without grad inside its ``gathered()``.
Layer units pair their collectives across ranks call by call, so:

- the training pass makes one decoder call per micro-batch (no shared
  prompt prefix, whose length buckets vary by rank), and a rank with fewer
  micro-batches runs zero-loss passes until all have run as many;
- no-grad calls (sampling, evaluation, the reference model's log-probs)
  gather every unit once and hold the whole model for the call, since
  ranks decode different numbers of tokens.

So a rank holds its shards of parameters, gradients and optimiser state,
plus one layer in full while training and the whole model (in the compute
dtype) while sampling. Checkpoints gather the whole state (see
``training_state``), so they resume at any world size.

Backend: NCCL when the device is CUDA, gloo otherwise.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True)
class World:
    """This process's place among the ranks; ``World()`` is a single process."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    fsdp: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes logs, samples and checkpoints."""
        return self.rank == 0

    def split(self, n: int) -> range:
        """This rank's contiguous share of n items, the first n % size ranks taking one more (may be empty)."""
        per, extra = divmod(n, self.size)
        start = self.rank * per + min(self.rank, extra)
        return range(start, start + per + (self.rank < extra))

    def gather(self, local: Tensor) -> Tensor:
        """Concatenate every rank's ``local`` along dim 0, in rank order (the ranks' lengths may differ)."""
        if self.size == 1:
            return local
        sizes = torch.tensor([local.shape[0]], device=self.device)
        counts = [torch.empty_like(sizes) for _ in range(self.size)]
        dist.all_gather(counts, sizes)
        counts = [int(c) for c in counts]
        longest = max(counts)
        padded = local.new_zeros((longest, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded, device=self.device) for _ in range(self.size)]
        dist.all_gather(parts, padded.to(self.device).contiguous())
        return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)]).to(local.device)

    def gather_objects(self, value: object) -> list[object]:
        """Every rank's picklable ``value``, in rank order."""
        if self.size == 1:
            return [value]
        out: list[object] = [None] * self.size
        dist.all_gather_object(out, value)
        return out

    def sum(self, values: Tensor) -> Tensor:
        """Element-wise sum over ranks (a copy; ``values`` is left alone)."""
        if self.size == 1:
            return values
        total = values.to(self.device, copy=True)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.to(values.device)

    def max(self, value: int) -> int:
        """The largest ``value`` over ranks."""
        if self.size == 1:
            return value
        top = torch.tensor([value], device=self.device)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return int(top.item())

    def broadcast_object(self, value: object) -> object:
        """Rank 0's ``value`` on every rank (e.g. a run directory named by the clock)."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_parameters(self, model: nn.Module) -> None:
        """Start every rank from rank 0's weights, as DDP does on construction."""
        if self.size == 1:
            return
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=0)

    def sync_gradients(self, params: Iterable[nn.Parameter]) -> None:
        """Sum the gradients over ranks in one flat all-reduce; a missing gradient counts as zero.

        Each rank's loss already carries the global normaliser, so the sum is
        the full-batch gradient (no division by the world size). Under FSDP
        the reduce-scatter in backward has already summed them.
        """
        if self.size == 1 or self.fsdp:
            return
        params = list(params)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def close(self) -> None:
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def backend_for(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes. On GPUs gloo carries the object collectives too
    (a run directory's name, pre-flight's verdict), so that they need no CUDA before the trainer sets its
    device, and NCCL's communicator starts at the first collective on a GPU tensor."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def use_device(device: torch.device) -> None:
    """Make ``device`` this process's current GPU: the first CUDA call of a run, made by the trainer once
    its reward and tool workers have forked (grpo/system/workers.py: no fork after CUDA starts)."""
    if device.type == "cuda":  # "cuda" alone (a world of one, --device auto or cuda) is the first GPU
        torch.cuda.set_device(device.index if device.index is not None else 0)


def init_world(device: str = "auto", *, fsdp: bool = False) -> World:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK), or a world of one.

    ``device`` is the config's: under ``auto`` or ``cuda`` each process takes
    the GPU of its local rank. CUDA is not initialised here (see :func:`use_device`).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(f"cuda:{local_rank}" if device == "cuda" else device)
    if size > 1 and not dist.is_initialized():  # no device_id: that would start NCCL, and CUDA, now
        dist.init_process_group(backend_for(dev))
    return World(rank=rank, size=size, local_rank=local_rank, device=dev, fsdp=fsdp and size > 1)


class ModelCalls(nn.Module):
    """The policy as FSDP sees it: with grad, ``policy(fn, *args)`` runs ``fn(model, *args)``; without,
    ``with policy.gathered() as model:`` holds the whole model for plain calls.

    The trainer's passes (sampling, log-probs, evaluation) use the model's
    parts directly, not ``model.forward``. The calls with grad (the update's
    ``rollout_logprobs``, its zero-loss padding passes) go through this
    module's ``forward``, so that FSDP's root unit (embeddings, final norm,
    output layer) gathers its parameters in its pre-forward hook and hooks
    the backward of the call's output; each decoder layer gathers its own
    when it runs. Without FSDP both are plain calls.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable, *args: object, **kwargs: object) -> object:
        return fn(self.model, *args, **kwargs)

    @contextmanager
    def gathered(self) -> Iterator[nn.Module]:
        """The whole model, without grad, for the body's calls (sampling, evaluation, the reference's
        log-probs); ``with policy.gathered(): pass`` takes part in the others' gathers with nothing to do.

        Under FSDP every unit is gathered once, on entry, and resharded on
        exit, even when the body raises: one all-gather per unit on every
        rank, however many tokens each rank decodes (the per-layer gathers of
        a forward would have to pair up across ranks call by call). The body
        holds the whole model, in the compute dtype.

        Why the body may call the model directly, outside this module's
        ``forward`` (read from torch 2.13's ``torch/distributed/fsdp/_fully_shard``):

        - FSDP settles which unit is the root at the first forward of any
          unit; if a decoder layer ran first it would take that role, and the
          next forward through this module (the update's) would raise. So the
          root runs one empty call here, after the gathers: its pre-forward
          hook initialises it and, its parameters being gathered already,
          gathers nothing.
        - A layer's hooks find it unsharded and, with reshard_after_forward
          off, leave it so: no collective and no reshard inside the body.
          Outside the root's forward each layer's pre-forward opens a forward
          of its own, which on a GPU makes FSDP's all-gather streams wait on
          the compute stream and moves the layer's inputs to the device they
          are on: no change to what is computed.
        - The body's arguments do not pass the root's pre-forward, which on a
          GPU would cast their float tensors to the compute dtype, as copies
          (the rollout's mask and log-probs: the reference pass reads the mask
          only as ``mask > 0`` and the sampling log-probs not at all), and copy
          their dataclasses (the agent): the numbers are the same.
        """
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in self.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            with torch.no_grad():
                if units:
                    self(_nothing)  # the root unit's hooks (see above)
                yield self.model
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(unit is not self, recurse=False)


    def join_gathers(self) -> None:
        """Take part in the other ranks' gathers with nothing to do (a rank without prompts)."""
        with self.gathered():
            pass


def _nothing(model: nn.Module) -> None:
    """A call of the model that computes nothing."""


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks, FSDP's units (a Hugging Face decoder's ``layers``)."""
    return list(model.get_decoder().layers)


def shard_policy(model: nn.Module, world: World) -> ModelCalls:
    """Wrap the model for calls; under FSDP shard it over the ranks, one unit per decoder layer, then the root.

    Each layer's parameters are gathered for its forward and freed after it
    (``reshard_after_forward``), gathered again for its backward, and its
    gradients reduce-scattered: a rank holds its shards plus about one layer
    in full. On CUDA the layers compute in bf16 and reduce gradients in fp32;
    the sharded (master) parameters and the optimiser state stay fp32.
    """
    policy = ModelCalls(model)
    if not world.fsdp:
        return policy
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(world.device.type, (world.size,))
    precision = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                 if world.device.type == "cuda" else MixedPrecisionPolicy())
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True, mp_policy=precision)
    fully_shard(policy, mesh=mesh, mp_policy=precision)  # the rest: embeddings, final norm, output layer
    for unit in policy.modules():
        if isinstance(unit, FSDPModule):
            # Each rank's loss carries the global normaliser: sum the shards' gradients, don't average.
            # (a plain SUM: gloo has no PREMUL_SUM, the op FSDP uses for a divide factor otherwise)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return policy


def pad_micro_batches(batches: list, world: World) -> list[tuple[object, float]]:
    """(micro-batch, weight) pairs; under FSDP padded so that every rank runs as many as the busiest.

    FSDP's collectives pair up across ranks, layer by layer, so a rank with
    fewer micro-batches (or none: no informative group of its own) adds
    passes of weight 0 (no groups), which the trainer runs as a one-token
    forward and backward with a zero loss.
    """
    plan = [(groups, 1.0) for groups in batches]
    if not world.fsdp:
        return plan
    return plan + [(None, 0.0)] * (world.max(len(batches)) - len(batches))


def full_state_dict(model: nn.Module, world: World) -> dict[str, Tensor] | None:
    """The whole, unsharded state dict (on the CPU), whatever the world; collective under FSDP.

    What is saved is always this full state, so a checkpoint loads at any world size.
    """
    if not world.fsdp:
        return None
    from torch.distributed.tensor import DTensor

    state = {}
    for key, value in model.state_dict().items():
        state[key] = (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()
    return state


def training_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The whole trainable parameters and optimiser state, by parameter name, on the CPU: what a
    checkpoint holds, whatever the world. Collective under FSDP (rank 0 alone then gets them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    weights, state = get_state_dict(model, optimizer, options=options)
    # (a frozen weight tied to another name, such as a LoRA model's output layer, can slip through)
    trainable = {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    return {name: value for name, value in weights.items() if name in trainable}, state


def load_training_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict, state: dict) -> None:
    """Load ``training_state``'s output, written at any world size, into this process's (shards of the)
    model and optimiser. The optimiser keeps its own kernel choice (fused or not: not under FSDP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    kernels = [{k: group[k] for k in ("fused", "foreach") if k in group} for group in optimizer.param_groups]
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=state,
                   options=StateDictOptions(full_state_dict=True, strict=False))
    for group, kernel in zip(optimizer.param_groups, kernels, strict=True):
        group.update(kernel)


def save_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Each process writes its shards of the trainable parameters and optimiser state (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    weights, state = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    dcp.save({"model": weights, "optimizer": state}, checkpoint_id=folder)


def load_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load ``save_shards``' output, written at any world size, into this process's model and optimiser,
    sharded or whole: torch.distributed.checkpoint reads the pieces each needs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    options = StateDictOptions(ignore_frozen_params=True)
    kernels = [{k: group[k] for k in ("fused", "foreach") if k in group} for group in optimizer.param_groups]
    weights, state = get_state_dict(model, optimizer, options=options)  # the layout to fill
    with warnings.catch_warnings():  # one process reading shards is what is meant here
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.load({"model": weights, "optimizer": state}, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=state,
                   options=StateDictOptions(ignore_frozen_params=True, strict=False))
    for group, kernel in zip(optimizer.param_groups, kernels, strict=True):
        group.update(kernel)


def to_float(value: Tensor) -> float:
    """A scalar that may be a DTensor (FSDP's gradient norm) as a float."""
    from torch.distributed.tensor import DTensor

    return float(value.full_tensor() if isinstance(value, DTensor) else value)
