"""Gathering a step's groups: prompts drawn, a group generated and scored for each, over one or more rounds.

With filter_groups (DAPO's dynamic sampling, Yu et al. 2025) the groups whose
rewards are all equal are dropped and more rounds are generated, up to
max_gen_rounds, until B informative groups are found; the batch trained (its
advantages and loss normaliser) is those groups. The frontier sampler sees
every round's rewards as soon as they are scored.

Under torchrun every count here is the whole draw's, so the rounds, the draws
and the batch are those of one process; each process generates its share
(``world.split``) of a draw's groups, and every completion draws from a random
stream keyed by its place in the run (grpo/sampling/random_streams.py), not by the process.

A row *errored* when its reward is no verdict on the completion: a reward call
raised or ran out of time, the environment raised, or the completion was cut
at the token limit under mask_truncated. Errored rows are left out of the loss
and of their group's mean and std (a group left with fewer than two valid
rows is left out whole), and counted by cause; only the model's own failures
(a wrong answer, no answer, a cut without mask_truncated) score 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from grpo.math.algorithm import group_varies, members_needed
from grpo.rewards.combine import pool_score_metrics
from grpo.sampling.episode_scores import episode_total, scored_tokens
from grpo.sampling.packed_linear import packed_linears
from grpo.sampling.random_streams import stream_keys
from grpo.sampling.rollout import Rollout, concat_rollouts, generate
from grpo.sampling.screen import Screening
from grpo.sampling.step_parts import Generation, Sampling
from grpo.system.distributed import World


@dataclass
class Round:
    """One generation round: a global draw of prompts, this process's groups, the whole draw's rewards."""

    prompts: list[int]  # the draw, every process's groups (indices into task.train)
    mine: range  # this process's groups, as positions in the draw
    rows: list[Mapping]  # this process's groups' rows
    rollout: Rollout  # this process's groups
    rewards: Tensor  # (n*G,) the whole draw's
    lengths: Tensor  # (n*G,) the whole draw's completion lengths
    truncated: Tensor  # (n*G,) the whole draw's
    errors: Tensor  # (n*G,) the whole draw's: 0, or 1 + the index in ERROR_CAUSES of why the row errored
    reward_means: dict[str, float]  # the scorer's metrics over the whole draw (its counts summed)
    explored: int  # how many prompts of the draw the sampler took by exploration
    seconds_generate: float
    first_try: list[bool]  # (n,) the draw's prompts never drawn before this round
    screening: Screening | None = None  # what the screen did for this round (grpo/sampling/screen.py); None: no screen
    estimator: str = "grpo"  # the advantage estimator, which says which groups teach

    def valid(self) -> Tensor:
        """(n, G) True for the rows that did not error."""
        return (self.errors == 0).view(len(self.prompts), -1)

    def varies(self) -> Tensor:
        """(n,) True where a group teaches under the estimator (for grpo: its valid rewards are not all
        equal): its advantages are not all zero."""
        grouped = self.rewards.view(len(self.prompts), -1)  # (n, G)
        return group_varies(grouped, self.valid(), estimator=self.estimator)  # (n,)


@dataclass
class Batch:
    """What a step trains on (this process's groups, the whole batch's rewards) and every round that made it."""

    rounds: list[Round]
    rows: list[Mapping]  # this process's trained groups' rows
    rollout: Rollout  # this process's trained groups: world.split(N / G) of the batch's
    rewards: Tensor  # (N,) the whole trained batch's
    lengths: Tensor  # (N,) the whole trained batch's completion lengths: its tokens in the loss
    truncated: Tensor  # (N,) the whole trained batch's
    errors: Tensor  # (N,) the whole trained batch's, as Round.errors

    def generated_rewards(self) -> Tensor:
        return torch.cat([r.rewards for r in self.rounds])  # (R*G,) every group generated this step

    def generated_lengths(self) -> Tensor:
        return torch.cat([r.lengths for r in self.rounds])  # (R*G,)

    def generated_errors(self) -> Tensor:
        return torch.cat([r.errors for r in self.rounds])  # (R*G,)

    def texts(self) -> list[str]:
        return [t for r in self.rounds for t in r.rollout.texts]  # this process's

    def group_rows(self, *, truncated: bool = False) -> list[Mapping]:
        """This process's rows, one per completion; with ``truncated``, marked as the rewards saw them."""
        g = self.rounds[0].rollout.group_size
        rows = [row for r in self.rounds for row in r.rows for _ in range(g)]
        if not truncated:
            return rows
        cut = [bool(c) for r in self.rounds for c in r.rollout.truncated.tolist()]
        return [{**row, "truncated": c} for row, c in zip(rows, cut, strict=True)]

    def to(self, device: torch.device | str) -> Batch:
        """The batch with every tensor on ``device`` (a checkpoint's batches sampled ahead load on the CPU)."""
        whole = ("rewards", "lengths", "truncated", "errors")
        rounds = [replace(r, rollout=moved(r.rollout, device), **{k: getattr(r, k).to(device) for k in whole})
                  for r in self.rounds]
        return replace(self, rounds=rounds, rollout=moved(self.rollout, device),
                       **{k: getattr(self, k).to(device) for k in whole})

    def reward_means(self) -> dict[str, float]:
        """The scorer's metrics over every completion generated: each reward function's mean, its counts
        summed over the rounds (pool_score_metrics)."""
        return pool_score_metrics([(len(r.rewards), r.reward_means) for r in self.rounds])


def empty_rollout(group_size: int) -> Rollout:
    """No groups: the share of a process that a draw or a batch smaller than the world leaves empty."""
    return Rollout(prompt_ids=[], completion_ids=torch.zeros((0, 1), dtype=torch.long), mask=torch.zeros((0, 1)),
                   logprobs=torch.zeros((0, 1)), truncated=torch.zeros(0, dtype=torch.bool), texts=[],
                   group_size=group_size)


def moved(rollout: Rollout, device: torch.device | str) -> Rollout:
    """The rollout with its tensors on ``device`` (on the CPU to send it to another process)."""
    tensors = ("completion_ids", "mask", "logprobs", "truncated")
    env_mask = None if rollout.env_mask is None else rollout.env_mask.to(device)
    return replace(rollout, env_mask=env_mask, **{name: getattr(rollout, name).to(device) for name in tensors})


def sample_batch(sampling: Sampling, step: int, avoid: Collection[int] = ()) -> Batch:
    """Draw B prompts, generate a group for each and score it.

    With filter_groups (DAPO's dynamic sampling), groups whose rewards are
    all equal are dropped and further rounds are generated until there are
    B informative groups, at most max_gen_rounds rounds; the batch trained
    is then the first B informative groups (fewer if the rounds ran out:
    the ``shortfall``), and the loss normaliser is theirs. Each round draws
    the missing groups divided by the share expected to vary (at most
    round_prompts; see :func:`round_size`). Every count is the whole
    draw's, so under torchrun the rounds, the draws and the batch are those
    of one process. ``avoid``: the
    prompts of batches sampled ahead and not yet trained on (grpo/run/async_batches.py).
    """
    with reordered_rounds(sampling.generation):
        return _sample_rounds(sampling, step, avoid)


def reordered_rounds(generation: Generation) -> AbstractContextManager:
    """Where the own engine samples, the rounds inside share one reordering of the weights (grpo/sampling/packed_linear.py,
    made at the first turn); vLLM samples elsewhere, so nothing."""
    return packed_linears(generation.model, lazy=True) if generation.engine is None else nullcontext()


def round_size(missing: int, share: float | None, cap: int, left: int) -> int:
    """The prompts a round draws: the ``missing`` informative groups over the ``share`` of groups expected to
    vary (None: nothing seen yet, so just the missing ones; 0: as many as allowed), at most ``cap`` (one
    round's) and ``left`` (the step's draws still allowed)."""
    wanted = missing if share is None else cap if share * cap <= missing else math.ceil(missing / share)
    return max(1, min(wanted, cap, left))


def _sample_rounds(sampling: Sampling, step: int, avoid: Collection[int]) -> Batch:
    """:func:`sample_batch`'s rounds. The first round is sized by the share of groups that varied in the
    steps before (DrawCounts.varied_share), later ones by this step's; a step draws at most B x
    max_gen_rounds prompts in all."""
    cfg, g, drawing = sampling.config, sampling.config.group_size, sampling.drawing
    rounds: list[Round] = []
    budget = cfg.prompts_per_step * cfg.max_gen_rounds
    n = round_size(cfg.prompts_per_step, drawing.draws.varied_share, cfg.round_cap, budget)  # B if not filter_groups
    while True:
        drawn_before = {i for r in rounds for i in r.prompts}
        drawn, screening = draw_round(sampling, n, step, len(rounds), drawn_before, avoid)
        rounds.append(generate_round(sampling, drawn, step, len(rounds)))
        rounds[-1].screening = screening
        drawing.sampler.observe(step, drawn, rounds[-1].rewards.view(-1, g), rounds[-1].valid())
        if drawing.screen is not None:
            drawing.screen.observe(step, drawn, rounds[-1].rewards.view(-1, g), rounds[-1].valid(),
                                    rounds[-1].varies())
        if not cfg.filter_groups or cfg.teacher:  # with a teacher every group carries its signal: all kept
            last = rounds[-1]
            return Batch(rounds, last.rows, last.rollout, last.rewards, last.lengths, last.truncated, last.errors)
        have = sum(int(r.varies().sum()) for r in rounds)
        missing = cfg.prompts_per_step - have
        so_far = sum(len(r.prompts) for r in rounds)
        if missing <= 0 or len(rounds) == cfg.max_gen_rounds or so_far >= budget:
            break
        n = round_size(missing, have / so_far, cfg.round_cap, budget - so_far)
    drawing.draws.observe_share(have / so_far)
    return informative_batch(sampling, rounds)


def draw_round(sampling: Sampling, n: int, step: int, index: int, exclude: Collection[int], avoid: Collection[int]
               ) -> tuple[list[int], Screening | None]:
    """Round ``index``'s n prompts: the sampler's draw, or, with a screen, the n of its candidates most likely
    to vary."""
    screen = sampling.drawing.screen
    if screen is None:
        return sampling.drawing.sampler.draw(n, step, exclude=exclude, avoid=avoid), None
    probe = screen.by == "probe"
    featurize = (lambda candidates: probe_features(sampling, candidates, step, index)) if probe else None
    return screen.draw(sampling, n, step, exclude, avoid, featurize)


PROBE_STREAMS = 1  # the extra part of a probe completion's stream key: (seed, step, round, candidate, 1)


def probe_features(sampling: Sampling, candidates: list[int], step: int, index: int
                   ) -> tuple[np.ndarray, float, np.ndarray]:
    """The ``probe`` screen's features: one completion sampled and scored for each candidate (its own random
    stream, so the groups generated later are independent of it), and from it (C, 5): the completion's
    probability q under the sampler (exp of its summed log-probs), its least likely token's probability,
    its reward r (clipped to [0, 1]; 0 where the row errored: grpo/sampling/rounds.py row_errors), q * r, and whether
    it ran into the token limit.
    Also the probe's seconds (the slowest process's) and each candidate's cost: its probe's tokens."""
    world = sampling.generation.world
    mine = world.split(len(candidates))
    keys = stream_keys(sampling.config.seed, step, index,
                       torch.arange(mine.start, mine.stop, device=sampling.generation.device), PROBE_STREAMS)
    if len(mine):
        rollout, rewards, _, seconds = sample_and_score(sampling, [candidates[i] for i in mine], streams=keys,
                                                        group_size=1)
        errored = row_errors(rewards, rollout, mask_truncated=sampling.config.mask_truncated).cpu() > 0
        x = probe_rows(rollout.logprobs.cpu(), rollout.mask.cpu() > 0, torch.where(errored, 0.0, rewards.cpu()),
                       rollout.truncated.cpu())
        cost = rollout.lengths.cpu().double().clamp(min=1).numpy()
    else:
        x, cost, seconds = np.zeros((0, 5)), np.zeros(0), 0.0
        if world.fsdp and samples_on_the_policy(sampling.generation):  # the others' generation gathers the parameters
            sampling.generation.policy.join_gathers()
    if world.size > 1:
        parts = world.gather_objects((x, cost, seconds))
        x, cost = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        seconds = max(p[2] for p in parts)
    return x, seconds, cost


def probe_rows(logprobs: Tensor, used: Tensor, rewards: Tensor, cut: Tensor) -> np.ndarray:
    """(c, 5) the probe screen's features of c completions from their log-probs and policy tokens (c, T),
    rewards (c,; errored rows 0) and cuts (c,): q = exp(summed log-probs), the least likely token's
    probability, the reward clipped to [0, 1], q times it, whether the completion was cut."""
    logp = logprobs.float()
    q = logp.sum(dim=1).exp()
    least = torch.where(used, logp, torch.zeros(())).min(dim=1).values.exp()
    r = rewards.float().clamp(0.0, 1.0)
    return torch.stack([q, least, r, q * r, cut.float()], dim=1).numpy()


def informative_batch(sampling: Sampling, rounds: list[Round]) -> Batch:
    """The first B informative groups of the rounds (in draw order), this process's share of them.

    The groups chosen live on the processes that sampled them; each sends
    its chosen ones to all, and each process keeps ``world.split`` of the
    batch, as when every group is informative.
    """
    gen, g = sampling.generation, sampling.config.group_size
    world = gen.world
    chosen = [(k, int(i)) for k, r in enumerate(rounds) for i in r.varies().nonzero().squeeze(1)]
    chosen = chosen[: sampling.config.prompts_per_step]  # (round, group in its draw) in draw order

    def whole(name: str) -> Tensor:  # (B'*G,) the chosen groups' values of a whole-draw field
        parts = [getattr(rounds[k], name).view(-1, g)[i] for k, i in chosen]
        return torch.cat(parts) if parts else getattr(rounds[0], name)[:0]

    sent = {}  # batch position -> (rollout of the group, its row): the groups this process sampled
    for place, (k, i) in enumerate(chosen):
        r = rounds[k]
        if i in r.mine:
            local = i - r.mine.start
            sent[place] = (moved(r.rollout.select_groups(torch.tensor([local])), "cpu"), r.rows[local])
    if world.size > 1:
        sent = {place: part for parts in world.gather_objects(sent) for place, part in parts.items()}
    mine = [sent[place] for place in world.split(len(chosen))]
    rollout = concat_rollouts([part for part, _ in mine], gen.tokenizer.pad_token_id) if mine else empty_rollout(g)
    return Batch(rounds, [row for _, row in mine], moved(rollout, gen.device), whole("rewards"),
                 whole("lengths"), whole("truncated"), whole("errors"))


def generate_round(sampling: Sampling, drawn: list[int], step: int, index: int) -> Round:
    """Generate and score the groups of the global draw that are this process's.

    Completion j of the draw samples from the random stream of (seed, step,
    round, j) (grpo/sampling/random_streams.py), so it is the same whichever process samples it.
    """
    gen, g = sampling.generation, sampling.config.group_size
    world, device = gen.world, gen.device
    mine = world.split(len(drawn))  # this process's groups
    rows_idx = [drawn[i] for i in mine]
    rows = [sampling.task.train[i] for i in rows_idx]
    streams = stream_keys(sampling.config.seed, step, index,
                          torch.arange(mine.start * g, mine.stop * g, device=device))
    if rows_idx:
        rollout, own_rewards, reward_means, seconds = sample_and_score(sampling, rows_idx, streams=streams)
    else:  # fewer groups in the draw than processes; on the device, as the others' tensors are
        rollout, own_rewards, reward_means, seconds = moved(empty_rollout(g), device), torch.zeros(0), {}, 0.0
        if world.fsdp and samples_on_the_policy(gen):  # the others' generation gathers the sharded parameters:
            gen.policy.join_gathers()  # take part
    errors = row_errors(own_rewards, rollout, mask_truncated=sampling.config.mask_truncated)
    own_rewards = torch.where(own_rewards.isnan(), 0.0, own_rewards)  # errored rows: 0, never read as verdicts
    rewards = world.gather(own_rewards.to(device))  # (n*G,) the whole draw's
    return Round(
        prompts=drawn, mine=mine, rows=rows, rollout=rollout, rewards=rewards,
        lengths=world.gather(rollout.lengths), truncated=world.gather(rollout.truncated),
        errors=world.gather(errors.to(device)), reward_means=whole_draw_means(world, len(rows_idx) * g, reward_means),
        explored=getattr(sampling.drawing.sampler, "explored", 0), seconds_generate=seconds,
        first_try=sampling.drawing.draws.first_tries(drawn), estimator=sampling.config.advantage_estimator,
    )


def samples_on_the_policy(generation: Generation) -> bool:
    """Whether a round samples on the policy (under FSDP, a gather of every unit, matched on every rank):
    the own sampler, or episodes, whose turns run under the policy's call; vLLM alone samples outside it."""
    return generation.engine is None or generation.agent is not None


ERROR_CAUSES = ("reward", "environment", "truncated")  # why a row errored, in the order a row is checked


def row_errors(rewards: Tensor, rollout: Rollout, *, mask_truncated: bool) -> Tensor:
    """(N,) 0 where the row's reward is a verdict, else 1 + the index in ERROR_CAUSES of why it is not:
    a reward call failed (NaN from the scorer), the environment raised (NaN from episode_total), the
    completion was cut at the token limit and mask_truncated leaves such rows out."""
    none = torch.zeros(len(rewards), dtype=torch.bool)  # (N,)
    env = none if rollout.episodes is None else torch.tensor([e.env_error is not None for e in rollout.episodes],
                                                              dtype=torch.bool)
    cut = rollout.truncated.cpu() if mask_truncated else none
    nan = rewards.cpu().isnan()
    errors = torch.zeros(len(rewards), dtype=torch.long)
    errors[cut] = 1 + ERROR_CAUSES.index("truncated")
    errors[nan & ~env] = 1 + ERROR_CAUSES.index("reward")
    errors[env] = 1 + ERROR_CAUSES.index("environment")
    return errors


def leave_out_errored(batch: Batch, world: World, *, group_size: int, estimator: str) -> tuple[Batch, Tensor]:
    """The batch to train on (``batch`` itself is never changed) and (N,) True for its rows that keep their
    place: rows that did not error, in groups with at least as many as the estimator compares (two; one for
    reinforce_pp, whose baseline is the batch's: grpo.math.algorithm.members_needed). The others leave the loss
    (a new rollout's masks, this process's rows) and its normaliser (``lengths`` 0); their advantages are 0."""
    g = group_size
    valid = (batch.errors == 0).view(-1, g)  # (B', G)
    needed = members_needed(estimator)
    valid = (valid & (valid.sum(dim=1, keepdim=True) >= needed)).reshape(-1)  # (N,)
    if bool(valid.all()):
        return batch, valid
    first = world.split(valid.numel() // g).start * g  # this process's first row of the batch
    mine = valid[first : first + batch.rollout.mask.shape[0]]  # (n,)
    mask = batch.rollout.mask * mine.unsqueeze(1).to(batch.rollout.mask.dtype)  # (n, T)
    lengths = torch.where(valid.to(batch.lengths.device), batch.lengths, 0)  # (N,)
    return replace(batch, rollout=replace(batch.rollout, mask=mask), lengths=lengths), valid


def whole_draw_means(world: World, rows: int, metrics: dict[str, float]) -> dict[str, float]:
    """The scorer's metrics of this process's ``rows`` as the whole draw's: its means over every process's
    rows, its counts summed over the processes (pool_score_metrics)."""
    if world.size == 1:
        return metrics
    return pool_score_metrics(world.gather_objects((rows, metrics)))


def sample_and_score(
    sampling: Sampling, prompts: Sequence[int], generator: torch.Generator | None = None,
    stop_early: Callable[[int, int], bool] | None = None, *, streams: Tensor | None = None,
    group_size: int = 0,
) -> tuple[Rollout, Tensor, dict[str, float], float]:
    """A group for each of these training prompts, scored: the rollout, its rewards (n*G,; NaN where a
    reward call or the environment failed: see row_errors), the scorer's metrics and the seconds
    generation took. Training rounds (with a random stream per completion), the probe screen (groups of
    ``group_size`` 1; 0: the run's G) and the pre-flight check (with a generator) share it."""
    cfg, gen = sampling.config, sampling.generation
    g = group_size or cfg.group_size
    t0 = time.perf_counter()
    gen.model.eval()
    options = dict(group_size=g, max_new_tokens=cfg.max_new_tokens, temperature=gen.temperature.value,
                   top_p=cfg.top_p, top_k=cfg.top_k, stop_strings=cfg.stop, generator=generator)
    rows = [sampling.task.train[i] for i in prompts]
    with gen.autocast, (gen.policy.gathered() if samples_on_the_policy(gen) else nullcontext()) as model:
        if gen.agent is not None:  # episodes, their turns sampled by the engine or by the policy itself
            rollout = gen.agent.run(model, gen.tokenizer, rows, streams=streams, engine=gen.engine,
                                    token_budget=cfg.micro_batch_tokens, **options)
        elif gen.engine is not None:  # no stop_early: vLLM runs each completion to its end
            rollout = gen.engine.generate([sampling.train_prompts[i] for i in prompts], streams=streams, **options)
            rollout = moved(rollout, gen.device)
        else:  # each completion a one-turn episode, sampled on the policy itself
            rollout = generate(model, gen.tokenizer, [sampling.train_prompts[i] for i in prompts],
                               stop_early=stop_early, streams=streams, token_budget=cfg.micro_batch_tokens, **options)
    seconds = time.perf_counter() - t0
    group_rows = [sampling.task.train[i] for i in prompts for _ in range(g)]
    ids = [row[:n].tolist() for row, n in zip(rollout.completion_ids, rollout.spans, strict=True)]
    rewards, metrics = sampling.scoring.score(rollout.texts, group_rows, scored_tokens(rollout), ids,
                                              truncated=rollout.truncated.tolist(),
                                              max_completion_tokens=cfg.max_new_tokens)
    if rollout.episodes is not None:  # plus the environment's rewards; NaN where it raised
        rewards = torch.tensor([episode_total(float(r), e) for r, e in zip(rewards, rollout.episodes, strict=True)])
    return rollout, rewards, metrics, seconds
