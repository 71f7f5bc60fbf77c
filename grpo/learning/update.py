"""The optimisation of one batch: epochs, minibatches of whole groups, micro-batches, TIS weights,
normalisers, gradient sync, and one optimiser step per minibatch.

Where tensors live: everything per token or per completion (the rollout's
ids, masks and log-probs, rewards, advantages, lengths) is on the policy's
device; the bookkeeping over groups (orders, minibatches, micro-batches and
masks over them) is on the CPU. Indexing a device tensor with a CPU index is
fine; a CPU tensor is never indexed with a device mask (CUDA refuses it).

The surrogate itself is :func:`grpo.math.loss.policy_loss`; here is only how
the batch is cut and fed to it. With mu = 1 and one minibatch the update is
on-policy and the ratio is 1. A group whose advantages are all zero adds
nothing to the gradient when beta = 0, so its passes are skipped (the
normaliser still counts its tokens); a minibatch with no such group makes no
optimiser step at all, and a step whose loss or gradient is NaN/inf is
skipped and counted.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from grpo.config import TrainConfig
from grpo.learning.logprobs import rollout_logprobs
from grpo.learning.step_stats import MicroResult, StepStats, add_micro, whole_batch_stats
from grpo.learning.teacher.scoring import (
    TeacherScores,
    full_form_pass,
    micro_batched_scores,
    teacher_loss,
    teacher_pass,
)
from grpo.math.algorithm import tis_weights
from grpo.math.loss import policy_loss
from grpo.sampling.rollout import Rollout, group_rows
from grpo.sampling.step_parts import Learner
from grpo.system.distributed import ModelCalls, pad_micro_batches, to_float

if TYPE_CHECKING:
    from grpo.sampling.vllm_engine import VLLMEngine

@dataclass(frozen=True)
class Micro:
    """One micro-batch: whole groups, or the rows start:stop of one group that alone is over
    micro_batch_tokens (its prompt then runs once per part; the gradients add up the same)."""

    groups: Tensor  # (b,) group indices in the rollout
    start: int = 0
    stop: int = 0  # 0: whole groups

    def rows(self, group_size: int) -> Tensor:
        """(n,) the micro-batch's row indices in the rollout."""
        return group_rows(self.groups, group_size, self.start, self.stop or group_size)

    def select(self, rollout: Rollout) -> Rollout:
        return rollout.select_groups(self.groups, self.start, self.stop or rollout.group_size)


@dataclass
class Minibatch:
    """The part of a minibatch one process trains on, and the whole minibatch's loss normalisers."""

    groups: Tensor  # this process's informative groups of the minibatch, as indices into its rollout
    first: int  # global index of this process's first group
    total_tokens: float  # the whole minibatch's tokens in the loss
    total_sequences: float


@dataclass(frozen=True)
class UpdateInputs:
    """What every micro-step of one update reads: the batch, and what was computed from it before the first
    optimiser step."""

    rollout: Rollout  # this process's groups
    advantages: Tensor  # (N,) the whole batch's
    ref_logp: Tensor | None  # (n, T) the reference's log-probs of the rollout (None: beta = 0)
    teacher: TeacherScores | None  # the teacher's scores of the rollout (None: no teacher, or the full form)
    old_logp: Tensor | None  # (n, T) pi_old of an off-policy update with TIS (None: not needed)


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up over warmup_steps (step counts from 1), then constant."""
    return config.lr * min(1.0, step / (config.warmup_steps + 1))


def on_policy(config: TrainConfig) -> bool:
    """One pass, one minibatch: the weights the loss sees are those that sampled (pi_old = pi_theta)."""
    return config.epochs == 1 and config.minibatches == 1


def update(learner: Learner, rollout: Rollout, advantages: Tensor, ref_logp: Tensor | None,
           lengths: Tensor) -> StepStats:
    """mu passes over the batch, split into minibatches of whole groups; one optimiser step each.

    The old policy is the trainer's own log-probs and each token is weighted
    by its truncated importance ratio to the sampler's (TIS, tis_cap > 0;
    one extra no-grad pass when off-policy), or, with tis_cap = 0, the
    sampler's log-probs (rollout.logprobs), as PPO has it.
    Under torchrun ``rollout`` and ``ref_logp`` hold this process's groups
    (``world.split`` of the batch's) and ``advantages`` and ``lengths`` (the
    tokens each completion puts in the loss) the whole batch's; minibatches
    and normalisers are the whole batch's, and the gradients are summed
    over processes.
    """
    cfg, g = learner.config, learner.config.group_size
    n_groups = advantages.numel() // g
    first = learner.world.split(n_groups).start  # global index of this process's first group
    # a group whose advantages are 0 still learns from the teacher's term or the KL term
    skip = cfg.skip_zero_advantage and cfg.beta == 0.0 and learner.teacher is None
    teacher = teacher_scores(learner, rollout)  # the sampled form's, before the first optimiser step
    stats, sums = StepStats(), {"weight": 0.0}
    # off-policy passes (mu > 1 or several minibatches) need pi_old before the first optimiser step
    old_all = trainer_logprobs(learner, rollout) if cfg.tis_cap and not on_policy(cfg) else None
    inputs = UpdateInputs(rollout, advantages, ref_logp, teacher, old_all)
    for _ in range(cfg.epochs):
        seed = learner.order_rng.randrange(2**31)  # the prompt sampler's RNG, unless sampling runs ahead
        order = torch.randperm(n_groups, generator=torch.Generator().manual_seed(seed))
        for minibatch in order.chunk(cfg.minibatches):
            rows = (minibatch.unsqueeze(1) * g + torch.arange(g)).reshape(-1)
            todo = trained_groups(minibatch, advantages, g, skip_zero=skip)
            if len(todo) == 0:
                continue  # nothing to learn from: no update, rather than a momentum-only one
            own = todo[(todo >= first) & (todo < first + len(rollout.prompt_ids))] - first
            # lengths are 0 for completions masked whole (mask_truncated): they leave both normalisers
            part = Minibatch(own, first, float(lengths[rows].sum()), float((lengths[rows] > 0).sum()))
            minibatch_step(learner, inputs, part, stats, sums)
    return whole_batch_stats(learner.world, stats, sums, teacher=learner.teacher is not None)


def trained_groups(minibatch: Tensor, advantages: Tensor, group_size: int, *, skip_zero: bool) -> Tensor:
    """The groups of ``minibatch`` (B',) to run forward and backward: with ``skip_zero``, those whose
    advantages (N,), on the policy's device, are not all zero. On the CPU, as all group bookkeeping is."""
    if not skip_zero:
        return minibatch
    informative = (advantages.view(-1, group_size) != 0).any(dim=1).cpu()  # (B,)
    return minibatch[informative[minibatch]]


def minibatch_step(learner: Learner, inputs: UpdateInputs, part: Minibatch, stats: StepStats,
                   sums: dict[str, float]) -> None:
    """Accumulate the minibatch's gradient over its micro-batches (their metrics added to ``sums`` in the
    order they run), sync it, clip it and step (or skip a non-finite step, on every process alike)."""
    cfg = learner.config
    learner.optimizer.zero_grad(set_to_none=True)
    minibatch_loss = 0.0
    for micro, micro_weight in pad_micro_batches(micro_batches(cfg, inputs.rollout, part.groups), learner.world):
        if micro_weight == 0.0:  # FSDP padding: the collectives run, the gradient gets 0
            learner.policy(zero_loss).backward()
            continue
        measured = micro_step(learner, inputs, micro, part)
        add_micro(sums, stats, measured)
        minibatch_loss += measured.loss
    params = [p for p in learner.model.parameters() if p.requires_grad]
    learner.world.sync_gradients(params)
    if cfg.max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    else:
        norm = torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
    stats.grad_norm = to_float(norm)
    finite = math.isfinite(minibatch_loss) and math.isfinite(stats.grad_norm)
    if not bool(learner.world.sum(torch.tensor([0.0 if finite else 1.0])) == 0):  # all ranks agree
        # a NaN/inf would poison the weights and Adam's moments for good: skip, count
        learner.optimizer.zero_grad(set_to_none=True)
        stats.nonfinite_skipped += 1
        return
    learner.optimizer.step()
    stats.optimizer_steps += 1


def micro_step(learner: Learner, inputs: UpdateInputs, micro: Micro, part: Minibatch) -> MicroResult:
    """The loss of one micro-batch of groups, backpropagated, and what it measured."""
    cfg, g = learner.config, learner.config.group_size
    sub, sub_rows = micro.select(inputs.rollout), micro.rows(g)
    ref_logp = inputs.ref_logp
    logp, entropy, jsd, scores = training_pass(learner, sub, sub_rows, inputs.teacher)
    old_logp, tis_weight, tis = old_policy(cfg, logp.float(), sub, sub_rows, inputs.old_logp)
    loss, m = policy_loss(
        logp.float(), old_logp, inputs.advantages[sub_rows + part.first * g], sub.mask,
        ref_logp=None if ref_logp is None else ref_logp[sub_rows, : sub.mask.shape[1]],
        objective=cfg.objective, beta=cfg.beta, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
        ratio_cap=cfg.ratio_cap, sapo_tau_pos=cfg.sapo_tau_pos, sapo_tau_neg=cfg.sapo_tau_neg,
        ratio_level=cfg.ratio_level, aggregate=cfg.aggregate,
        max_tokens=cfg.max_new_tokens, total_tokens=part.total_tokens,
        total_sequences=part.total_sequences, tis_weight=tis_weight,
    )
    if scores is not None:  # the teacher's term, its own term of the loss, per token
        term, teacher_m = teacher_loss(cfg, logp.float(), scores, jsd, sub.mask, total_tokens=part.total_tokens,
                                       total_sequences=part.total_sequences)
        loss = loss + term
        m.update(teacher_m)
    peak = tis.pop("sampler_logp_diff_max", None)  # a maximum, not a token-weighted mean
    masked_seqs = tis.pop("tis_masked_sequences", None)  # a share of completions, weighted by them
    n_seq = None if masked_seqs is None else float((sub.mask.sum(dim=1) > 0).sum())
    m.update(tis)
    loss.backward()
    w = float(sub.mask.sum())
    return MicroResult(
        loss=loss.item(), weight=w, metrics={k: v.item() * w for k, v in m.items()},
        entropy=float((entropy * sub.mask).sum()), trained_sequences=len(sub_rows),
        logp_diff_max=None if peak is None else float(peak), sequences=n_seq,
        masked_sequences=None if masked_seqs is None else float(masked_seqs) * n_seq,
    )


def old_policy(cfg: TrainConfig, logp: Tensor, sub: Rollout, rows: Tensor, old_all: Tensor | None
               ) -> tuple[Tensor, Tensor | None, dict[str, Tensor]]:
    """pi_old's log-probs for the micro-batch of the rollout's ``rows`` (``sub``), and the TIS weights.

    Without TIS (tis_cap = 0) pi_old is the sampler's log-probs, as PPO
    has it. With TIS pi_old is the trainer's own: the current log-probs,
    detached, when on-policy, else those computed before the update
    (``old_all``); the weights carry the sampler/trainer mismatch
    (:func:`grpo.math.algorithm.tis_weights`).
    """
    if not cfg.tis_cap:
        return sub.logprobs, None, {}
    if old_all is None:
        old = logp.detach()
    else:
        old = old_all[rows, : sub.mask.shape[1]]
    weight, metrics = tis_weights(old, sub.logprobs, sub.mask, cap=cfg.tis_cap, level=cfg.tis_level,
                                  mode=cfg.tis_mode, low=cfg.tis_low)
    return old, weight, metrics


def training_pass(learner: Learner, sub: Rollout, rows: Tensor, teacher: TeacherScores | None
                  ) -> tuple[Tensor, Tensor, Tensor | None, TeacherScores | None]:
    """The policy's log-probs and entropy of a micro-batch's tokens (N', T), with grad, and the teacher's
    term's inputs: the full form's divergence per token (else None), computed here beside the student's
    pass, and the teacher's scores of the micro-batch's rows (None without a teacher)."""
    cfg, pad_id = learner.config, learner.tokenizer.pad_token_id
    # under FSDP one decoder call per micro-batch, so that every rank gathers each layer
    # as often (the shared-prefix pass makes a data-dependent number of calls)
    passes = dict(temperature=learner.temperature.value, share_prefix=not learner.world.fsdp,
                  checkpoint_layers=cfg.gradient_checkpointing)
    with learner.autocast:
        if learner.teacher is not None and cfg.teacher_loss == "full":
            return learner.policy(full_form_pass, sub, learner.teacher, pad_id, beta=cfg.teacher_beta,
                                  vocab=len(learner.tokenizer), **passes)
        logp, entropy = learner.policy(rollout_logprobs, sub, pad_id, with_entropy=True, **passes)
    return logp, entropy, None, None if teacher is None else teacher.rows(rows, sub.mask.shape[1])


@torch.no_grad()
def teacher_scores(learner: Learner, rollout: Rollout) -> TeacherScores | None:
    """The teacher's scores of the rollout's sampled tokens, (N, T), for the sampled form (the full form
    scores inside each micro-step); None without a teacher. Micro-batched as the reference's log-probs."""
    if learner.teacher is None or learner.config.teacher_loss == "full" or not rollout.prompt_ids:
        return None
    parts = micro_batches(learner.config, rollout, torch.arange(len(rollout.prompt_ids)))
    with learner.autocast:
        return micro_batched_scores(learner.teacher, rollout, parts, learner.tokenizer.pad_token_id,
                                    temperature=learner.temperature.value, vocab=len(learner.tokenizer))


@torch.no_grad()
def teacher_divergence(learner: Learner, rollout: Rollout) -> float | None:
    """What a step on ``rollout`` before any update would log as ``teacher_kl``: the token mean, over every
    micro-batch, of log p - log p_teacher at the sampled tokens (the full form: its exact divergence per
    token); the passes a step runs, without grad (the pre-flight check's report). None without a teacher."""
    if learner.teacher is None or not rollout.prompt_ids:
        return None
    cfg, total, tokens = learner.config, 0.0, 0.0
    teacher = teacher_scores(learner, rollout)
    for micro in micro_batches(cfg, rollout, torch.arange(len(rollout.prompt_ids))):
        sub = micro.select(rollout)
        logp, _, jsd, scores = training_pass(learner, sub, micro.rows(cfg.group_size), teacher)
        per_token = jsd if jsd is not None else logp.float() - scores.logp  # (N', T)
        total += float((per_token.float() * sub.mask).sum())
        tokens += float(sub.mask.sum())
    return total / max(tokens, 1.0)


@torch.no_grad()
def reference_logprobs(learner: Learner, rollout: Rollout) -> Tensor | None:
    """The frozen reference's log-probs of the rollout's tokens, (N, T), for the KL term; None when beta = 0.
    With LoRA the reference is the base model: the policy with its adapter disabled."""
    if learner.config.beta == 0.0:
        return None
    if learner.reference is not None:
        return scored_logprobs(learner, learner.reference, rollout)
    return scored_logprobs(learner, learner.policy, rollout, learner.model.disable_adapter())


def scored_logprobs(learner: Learner, policy: ModelCalls, rollout: Rollout, context: object = None) -> Tensor:
    """``policy``'s log-probs of the rollout's tokens, (N, T), without grad, inside ``context``, micro-batch
    by micro-batch as the update packs them (within micro_batch_tokens); a process with no group of the
    batch joins the FSDP gathers and returns the rollout's own."""
    if not rollout.prompt_ids:
        policy.join_gathers()
        return rollout.logprobs
    parts = micro_batches(learner.config, rollout, torch.arange(len(rollout.prompt_ids)))
    with context or nullcontext(), learner.autocast, policy.gathered() as model:
        return micro_batched_logprobs(model, rollout, parts, learner.tokenizer.pad_token_id,
                                      temperature=learner.temperature.value)


def micro_batched_logprobs(model: nn.Module, rollout: Rollout, parts: list[Micro], pad_id: int, *,
                           temperature: float) -> Tensor:
    """The rollout's log-probs, (N, T) in fp32, one ``rollout_logprobs`` call per micro-batch of ``parts``
    (which cover every row once): each call repeats only its own prompts' cache, never all N rows'."""
    out = torch.zeros(rollout.completion_ids.shape, device=rollout.completion_ids.device)  # (N, T)
    for micro in parts:
        sub = micro.select(rollout)
        logp, _ = rollout_logprobs(model, sub, pad_id, temperature=temperature)  # (n, T')
        out[micro.rows(rollout.group_size).to(out.device), : logp.shape[1]] = logp.float()
    return out


@torch.no_grad()
def trainer_logprobs(learner: Learner, rollout: Rollout) -> Tensor:
    """The policy's log-probs of the rollout's tokens now, (N, T): pi_old of an off-policy update."""
    learner.model.eval()
    logp = scored_logprobs(learner, learner.policy, rollout)
    learner.model.train()
    return logp


def micro_batches(cfg: TrainConfig, rollout: Rollout, groups: Tensor) -> list[Micro]:
    """Pack whole groups, longest first, into micro-batches of at most micro_batch_tokens (prompt plus
    G times the group's longest completion). Sorting by length keeps padding low. A group over the
    budget alone is split into parts of as many rows as fit (at least one), each its own micro-batch.
    """
    g = cfg.group_size
    lengths = rollout.lengths.view(-1, g).max(dim=1).values  # (B,)
    cost = {int(i): len(rollout.prompt_ids[int(i)]) + g * int(lengths[int(i)]) for i in groups}
    ordered = sorted(cost, key=lambda i: -cost[i])
    batches, current, used = [], [], 0
    for i in ordered:
        if cost[i] > cfg.micro_batch_tokens and g > 1:
            rows = max(1, (cfg.micro_batch_tokens - len(rollout.prompt_ids[i])) // max(int(lengths[i]), 1))
            batches += [Micro(torch.tensor([i]), s, min(s + rows, g)) for s in range(0, g, rows)]
            continue
        if current and used + cost[i] > cfg.micro_batch_tokens:
            batches.append(Micro(torch.tensor(current)))
            current, used = [], 0
        current.append(i)
        used += cost[i]
    if current:
        batches.append(Micro(torch.tensor(current)))
    return batches


def zero_loss(model: nn.Module) -> Tensor:
    """0 x a one-token forward: runs every layer once, as a micro-batch does, and adds nothing."""
    hidden = model.get_decoder()(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model.device))
    return (hidden.last_hidden_state.sum() + model.get_output_embeddings().weight.sum()) * 0.0


def update_seconds(learner: Learner, rollout: Rollout, engine: VLLMEngine | None = None) -> float:
    """Seconds per completion token of a forward and backward pass (what an update costs, less the
    optimiser's step), timed on the first micro-batch of ``rollout`` as the update packs it; the
    gradients are dropped, so the run that follows is unchanged (the pre-flight check's step budget)."""
    if engine is not None:  # as a step does: on a GPU the backward gets vLLM's memory
        engine.sleep()
    cfg = learner.config
    n_groups = rollout.completion_ids.shape[0] // cfg.group_size
    part = micro_batches(cfg, rollout, torch.arange(n_groups))[0].select(rollout)
    start = gpu_clock()
    with learner.autocast:  # as micro_step calls it: under FSDP no shared prefix (its calls vary by rank)
        logp, _ = learner.policy(rollout_logprobs, part, learner.tokenizer.pad_token_id,
                                 temperature=learner.temperature.value, checkpoint_layers=cfg.gradient_checkpointing,
                                 share_prefix=not learner.world.fsdp)
    (logp.float() * part.mask).sum().backward()
    learner.optimizer.zero_grad(set_to_none=True)
    if learner.teacher is not None:  # the teacher's forward pass over the same tokens, as a step runs it
        with learner.autocast:
            teacher_pass(learner.teacher, part, learner.tokenizer.pad_token_id, temperature=learner.temperature.value,
                         vocab=len(learner.tokenizer))
    return (gpu_clock() - start) / max(float(part.mask.sum()), 1.0)


def gpu_clock() -> float:
    """time.perf_counter once the GPU has run what was queued (kernels run after the host queues them)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()
