"""The GRPO loop, top to bottom.

Each step: sample B prompts; generate G completions per prompt; score them;
standardise rewards within each group into advantages; update the policy
with the clipped surrogate (plus beta * KL when beta > 0); log.

Deviations from DeepSeekMath's GRPO, all configurable:
- the default aggregation is per token over the batch (DAPO), not the mean
  of per-sequence means;
- the default clip is asymmetric (DAPO's clip-higher: 0.2 below, 0.28 above);
- no KL penalty by default (beta = 0), so no reference model is loaded;
- a group whose rewards are all equal has zero advantages and, with beta = 0,
  contributes exactly nothing to the gradient, so its forward and backward
  passes are skipped (the loss normaliser still counts its tokens, so the
  update is unchanged); a step where every group is like that makes no
  optimiser update at all;
- an optimiser step whose loss or gradient is NaN/inf is skipped (and counted as
  nonfinite_skipped); max_bad_steps such steps in a row stop the run.

Checkpoints (grpo/checkpoint.py) make a resumed run bitwise the same as an unbroken one.

Under torchrun each process samples and trains on B/W whole groups of the
same global batch, with the whole batch's advantages and loss normaliser
(grpo/distributed.py), so the update does not depend on the world size W.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from grpo import checkpoint
from grpo.alarms import AlarmConfig, AlarmMonitor
from grpo.algorithm import group_advantages, policy_loss
from grpo.config import ConfigError, TrainConfig
from grpo.distributed import World, full_state_dict, init_world, pad_micro_batches, shard_policy, to_float
from grpo.evaluate import EvalResult, encode_prompts, evaluate
from grpo.interrupt import RunStopped, StopRequests
from grpo.metrics import MetricsLogger, repeated_ngram_frac
from grpo.models import add_lora, load_policy, save_model
from grpo.progress import StepProgress, summary_line
from grpo.rewards import combine_rewards, resolve_reward
from grpo.rollout import Rollout, generate, rollout_logprobs
from grpo.tasks import Task, load_task

RewardFn = Callable[[str, Mapping], float]


@dataclass
class StepStats:
    """What the update of one step measured (token-weighted means)."""

    loss: float = 0.0
    ratio_mean: float = 1.0
    clip_frac_low: float = 0.0
    clip_frac_high: float = 0.0
    kl: float = 0.0
    entropy: float = float("nan")
    grad_norm: float = 0.0
    optimizer_steps: int = 0
    nonfinite_skipped: int = 0
    trained_sequences: int = 0


@dataclass
class RunLog:
    """Where each step's metrics go: through the alarms (which add their flags), to the sinks."""

    monitor: AlarmMonitor
    logger: MetricsLogger | None
    bar: StepProgress
    raised: dict[str, int] = field(default_factory=dict)  # alarm -> first step it was on

    def record(self, step: int, metrics: dict[str, float]) -> None:
        flags, warnings = self.monitor.observe(step, metrics)
        metrics.update(flags)
        for name, on in flags.items():
            if on:
                self.raised.setdefault(name.removeprefix("alarm/"), step)
        for text in warnings:
            self.bar.warn(step, text)
        if self.logger is not None:
            self.logger.log(step, metrics)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class GRPOTrainer:
    """Trains a causal LM with GRPO. ``model``/``tokenizer``, ``task`` and ``rewards`` may be given
    as objects (the Python API); otherwise they come from the config's names."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        model: nn.Module | None = None,
        tokenizer: object | None = None,
        task: Task | None = None,
        rewards: Sequence[RewardFn | str] | None = None,
        progress: bool = True,
        world: World | None = None,
    ) -> None:
        self.config = config
        self.progress = progress
        self.task = task if task is not None else load_task(
            config.task, data=config.data, heldout_size=config.eval_size, prompt_field=config.prompt_field,
            answer_field=config.answer_field, system_prompt=config.system_prompt,
            prompt_template=config.prompt_template,
        )
        reward_specs = list(rewards) if rewards is not None else list(config.rewards)
        self.reward_fns = [resolve_reward(r) for r in reward_specs] or [self.task.reward]
        weights = config.reward_weights or (1.0,) * len(self.reward_fns)
        self.score = combine_rewards(
            self.reward_fns, weights, workers=config.reward_workers, timeout=config.reward_timeout,
            on_error=config.on_error, max_completion_tokens=config.max_new_tokens,
        )

        seed_everything(config.seed)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.world = world if world is not None else init_world(config.device, fsdp=config.fsdp)
        if config.prompts_per_step % self.world.size:
            raise ConfigError(
                f"prompts_per_step ({config.prompts_per_step}) must be divisible by the number of "
                f"processes ({self.world.size}): each process samples whole groups"
            )
        if config.fsdp and config.lora_rank > 0:
            raise ConfigError("fsdp with lora_rank > 0 is not supported yet")
        self.device = self.world.device if self.world.size > 1 else pick_device(config.device)
        if model is None:
            policy = load_policy(config.model, device=self.device)
            model, tokenizer = policy.model, policy.tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.to(self.device)
        if config.lora_rank > 0:
            model = add_lora(model, config.lora_rank, config.lora_alpha or None)
        self.model, self.tokenizer = model, tokenizer
        self.reference = self._reference_model()
        self.world.broadcast_parameters(model)
        self.policy = shard_policy(model, self.world)  # calls of the model that FSDP can see
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.prompt_rng = random.Random(config.seed)
        self.train_prompts = encode_prompts(tokenizer, [self.task.messages(r) for r in self.task.train])
        self.heldout_prompts = encode_prompts(tokenizer, [self.task.messages(r) for r in self.task.heldout])
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else nullcontext()
        )

    def _reference_model(self) -> nn.Module | None:
        """The frozen reference for the KL term; none when beta = 0. LoRA reuses the base weights."""
        if self.config.beta == 0.0 or self.config.lora_rank > 0:
            return None
        ref = copy.deepcopy(self.model).eval()
        ref.requires_grad_(False)
        return ref

    # ---- one GRPO step, in the algorithm's order ----

    def step(self, step: int) -> dict[str, float]:
        cfg = self.config
        t0 = time.perf_counter()
        drawn = [self.prompt_rng.randrange(len(self.task.train)) for _ in range(cfg.prompts_per_step)]
        rows_idx = [drawn[i] for i in self.world.shard(cfg.prompts_per_step)]  # this process's groups
        rows = [self.task.train[i] for i in rows_idx]

        self.model.eval()
        with self.autocast:
            rollout = self.policy.without_grad(
                generate, self.tokenizer, [self.train_prompts[i] for i in rows_idx],
                group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                stop_strings=cfg.stop, generator=self.generator,
            )
        t_gen = time.perf_counter()

        group_rows = [r for r in rows for _ in range(cfg.group_size)]
        own_rewards, reward_means = self.score(rollout.texts, group_rows, rollout.lengths.tolist())  # (N/W,)
        rewards = self.world.gather(own_rewards.to(self.device))  # (N,) the whole batch's
        means = self.world.sum(torch.tensor(list(reward_means.values()), dtype=torch.float64)) / self.world.size
        reward_means = dict(zip(reward_means, means.tolist(), strict=True))  # the whole batch's (equal shares)
        t_reward = time.perf_counter()

        advantages = group_advantages(rewards, cfg.group_size, scale=cfg.scale)  # (N,)
        ref_logp = self._reference_logprobs(rollout)
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(step)
        stats = self.update(rollout, advantages, ref_logp)
        t_end = time.perf_counter()

        grouped = rewards.view(-1, cfg.group_size)  # (B, G)
        zero_var = (grouped.max(dim=1).values == grouped.min(dim=1).values)
        lengths = self.world.gather(rollout.lengths)  # (N,)
        truncated = self.world.gather(rollout.truncated)  # (N,)
        n_tokens = float(lengths.sum())
        if cfg.sample_every and step % cfg.sample_every == 0:
            own = slice(rewards.numel() // self.world.size * self.world.rank, None)
            self._write_samples(step, rows, rollout, rewards[own], advantages[own])
        return {
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std().item(),
            **reward_means,
            "zero_var_frac": zero_var.float().mean().item(),
            "all_correct_frac": (zero_var & (grouped[:, 0] >= 1.0)).float().mean().item(),
            "all_wrong_frac": (zero_var & (grouped[:, 0] <= 0.0)).float().mean().item(),
            "accuracy": self._accuracy(rollout.texts, group_rows, rewards),
            "adv_mean": advantages.mean().item(),
            "adv_std": advantages.std().item(),
            "adv_nonzero_frac": (advantages != 0).float().mean().item(),
            "completion_len": lengths.float().mean().item(),
            "completion_len_max": lengths.max().item(),
            "truncated_frac": truncated.float().mean().item(),
            "repeat_ngram_frac": repeated_ngram_frac(rollout.completion_ids, rollout.mask),
            **{k: v for k, v in vars(stats).items()},
            "lr": self.learning_rate(step),
            "time_generate": t_gen - t0,
            "time_reward": t_reward - t_gen,
            "time_update": t_end - t_reward,
            "time_step": t_end - t0,
            "tokens_per_second": n_tokens / (t_end - t0),
        }

    def _accuracy(self, texts: Sequence[str], rows: Sequence[Mapping], rewards: Tensor) -> float:
        """Share of completions the task's checker marks fully correct (reuses the reward when it is the checker)."""
        if self.reward_fns == [self.task.reward] and not self.config.reward_weights:
            return (rewards >= 1.0).float().mean().item()
        return sum(self.task.reward(t, r) >= 1.0 for t, r in zip(texts, rows, strict=True)) / max(len(texts), 1)

    def learning_rate(self, step: int) -> float:
        """Linear warm-up over warmup_steps (step counts from 1), then constant."""
        return self.config.lr * min(1.0, step / (self.config.warmup_steps + 1))

    @torch.no_grad()
    def _reference_logprobs(self, rollout: Rollout) -> Tensor | None:
        if self.config.beta == 0.0:
            return None
        ref = self.reference
        ctx = self.model.disable_adapter() if ref is None else nullcontext()
        with ctx, self.autocast:
            logp, _ = rollout_logprobs(
                ref if ref is not None else self.model, rollout, self.tokenizer.pad_token_id,
                temperature=self.config.temperature,
            )
        return logp.float()

    def update(self, rollout: Rollout, advantages: Tensor, ref_logp: Tensor | None) -> StepStats:
        """mu passes over the batch, split into minibatches of whole groups; one optimiser step each.

        The old policy is the sampling-time one (rollout.logprobs): with mu = 1
        and one minibatch the update is on-policy and the ratio is 1.
        Under torchrun ``rollout`` and ``ref_logp`` hold this process's groups
        and ``advantages`` the whole batch's; minibatches and normalisers are
        the whole batch's, and the gradients are summed over processes.
        """
        cfg = self.config
        g = cfg.group_size
        n_groups = advantages.numel() // g
        first = self.world.shard(n_groups).start  # global index of this process's first group
        lengths = self.world.gather(rollout.lengths)  # (N,) for the global normaliser
        informative = (advantages.view(n_groups, g) != 0).any(dim=1)  # (B,)
        skip = cfg.skip_zero_advantage and cfg.beta == 0.0
        stats = StepStats()
        sums: dict[str, float] = {}
        weight = 0.0
        for _ in range(cfg.epochs):
            order = torch.randperm(n_groups, generator=torch.Generator().manual_seed(self.prompt_rng.randrange(2**31)))
            for minibatch in order.chunk(cfg.minibatches):
                rows = (minibatch.unsqueeze(1) * g + torch.arange(g)).reshape(-1)
                total_tokens = float(lengths[rows].sum())
                total_sequences = float(len(rows))
                todo = minibatch[informative[minibatch]] if skip else minibatch
                if len(todo) == 0:
                    continue  # nothing to learn from: no update, rather than a momentum-only one
                own = todo[(todo >= first) & (todo < first + len(rollout.prompt_ids))] - first
                self.optimizer.zero_grad(set_to_none=True)
                minibatch_loss = 0.0
                for micro, micro_weight in pad_micro_batches(self._micro_batches(rollout, own), self.world):
                    sub = rollout.select_groups(micro)
                    sub_rows = (micro.unsqueeze(1) * g + torch.arange(g)).reshape(-1)
                    with self.autocast:
                        logp, entropy = self.policy(
                            rollout_logprobs, sub, self.tokenizer.pad_token_id,
                            temperature=cfg.temperature, with_entropy=True,
                        )
                    loss, m = policy_loss(
                        logp.float(), sub.logprobs, advantages[sub_rows + first * g], sub.mask,
                        ref_logp=None if ref_logp is None else ref_logp[sub_rows, : sub.mask.shape[1]],
                        beta=cfg.beta, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                        ratio_level=cfg.ratio_level, aggregate=cfg.aggregate,
                        max_tokens=cfg.max_new_tokens, total_tokens=total_tokens,
                        total_sequences=total_sequences,
                    )
                    if micro_weight == 0.0:  # FSDP padding: the collectives run, the gradient gets 0
                        (loss * 0.0).backward()
                        continue
                    loss.backward()
                    w = float(sub.mask.sum())
                    weight += w
                    minibatch_loss += loss.item()
                    sums["loss"] = sums.get("loss", 0.0) + loss.item()
                    for k, v in m.items():
                        sums[k] = sums.get(k, 0.0) + v.item() * w
                    sums["entropy"] = sums.get("entropy", 0.0) + float((entropy * sub.mask).sum())
                    stats.trained_sequences += len(sub_rows)
                params = [p for p in self.model.parameters() if p.requires_grad]
                self.world.sync_gradients(params)
                if cfg.max_grad_norm > 0:
                    norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                else:
                    norm = torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
                stats.grad_norm = to_float(norm)
                finite = math.isfinite(minibatch_loss) and math.isfinite(stats.grad_norm)
                if not bool(self.world.sum(torch.tensor([0.0 if finite else 1.0])) == 0):  # all ranks agree
                    # a NaN/inf would poison the weights and Adam's moments for good: skip, count
                    self.optimizer.zero_grad(set_to_none=True)
                    stats.nonfinite_skipped += 1
                    continue
                self.optimizer.step()
                stats.optimizer_steps += 1
        keys = ("loss", "ratio_mean", "clip_frac_low", "clip_frac_high", "kl", "entropy")
        totals = self.world.sum(torch.tensor(
            [weight, stats.trained_sequences, *(sums.get(k, 0.0) for k in keys)], dtype=torch.float64))
        weight, stats.trained_sequences = float(totals[0]), int(totals[1])
        sums = dict(zip(keys, totals[2:].tolist(), strict=True))  # whole-batch sums over processes
        if weight > 0:
            stats.loss = sums["loss"] / max(stats.optimizer_steps, 1)
            for key in ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl", "entropy"):
                if key in sums:
                    setattr(stats, key, sums[key] / weight)
        return stats

    def _micro_batches(self, rollout: Rollout, groups: Tensor) -> list[Tensor]:
        """Pack whole groups, longest first, into micro-batches of at most micro_batch_tokens.

        Sorting by length keeps padding low; a group larger than the budget gets its own.
        """
        g = self.config.group_size
        lengths = rollout.lengths.view(-1, g).max(dim=1).values  # (B,)
        cost = {int(i): len(rollout.prompt_ids[int(i)]) + g * int(lengths[int(i)]) for i in groups}
        ordered = sorted(cost, key=lambda i: -cost[i])
        batches, current, used = [], [], 0
        for i in ordered:
            if current and used + cost[i] > self.config.micro_batch_tokens:
                batches.append(torch.tensor(current))
                current, used = [], 0
            current.append(i)
            used += cost[i]
        if current:
            batches.append(torch.tensor(current))
        return batches

    # ---- evaluation, logging, the run ----

    def evaluate(self, on_batch: Callable[[int], None] | None = None) -> EvalResult:
        """Greedy pass@1, and pass@k / maj@k from eval_samples samples, on the held-out prompts.

        The sampling generator is reseeded each time, so successive evaluations
        draw with the same random numbers and differ only by the model. Under
        torchrun each process scores every W-th prompt and the scores are summed.
        """
        cfg = self.config
        rank, size = self.world.rank, self.world.size
        prompts, rows = self.heldout_prompts[rank::size], self.task.heldout[rank::size]
        with self.autocast:
            mine = self.policy.without_grad(
                evaluate, self.tokenizer, prompts, rows, self.task.reward,
                max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
                samples=cfg.eval_samples, ks=cfg.eval_k, temperature=cfg.temperature,
                generator=torch.Generator(device=self.device).manual_seed(cfg.seed + 1 + rank), on_batch=on_batch,
                stop_strings=cfg.stop,
            )
        if size == 1:
            return mine
        keys_p, keys_m = sorted(mine.pass_at), sorted(mine.maj_at)
        values = [mine.accuracy, *(mine.pass_at[k] for k in keys_p), *(mine.maj_at[k] for k in keys_m)]
        totals = self.world.sum(torch.tensor([len(prompts), *(v * len(prompts) for v in values)], dtype=torch.float64))
        n = max(float(totals[0]), 1.0)
        means = [float(t) / n for t in totals[1:]]
        return EvalResult(
            accuracy=means[0], size=int(totals[0]), samples=mine.samples,
            pass_at=dict(zip(keys_p, means[1 : 1 + len(keys_p)], strict=True)),
            maj_at=dict(zip(keys_m, means[1 + len(keys_p) :], strict=True)),
        )

    def _write_samples(self, step: int, rows: Sequence[Mapping], rollout: Rollout, rewards: Tensor, adv: Tensor) -> None:
        if self.run_dir is None:
            return
        with (self.run_dir / "completions.jsonl").open("a", encoding="utf-8") as f:
            for i, text in enumerate(rollout.texts):
                row = rows[i // self.config.group_size]
                f.write(json.dumps({
                    "step": step, "prompt": str(row["prompt"]), "answer": str(row.get("answer", "")),
                    "completion": text, "reward": rewards[i].item(), "advantage": adv[i].item(),
                }) + "\n")

    run_dir: Path | None = None

    def train(self, run_dir: Path | None = None, *, resume: bool = False) -> dict:
        """Run config.steps GRPO steps with held-out evaluation before, after and every eval_every
        steps; watch the alarms; return the summary.

        With a run_dir, checkpoints are written every save_every steps and at the end, and
        SIGINT/SIGTERM stop the run after the current step with a checkpoint (RunStopped).
        ``resume`` continues run_dir from its latest checkpoint, exactly as if never stopped.
        """
        cfg = self.config
        main = self.world.is_main  # only rank 0 writes
        self.run_dir = run_dir if main else None
        start = time.perf_counter()
        saved = self._resume(run_dir) if resume else {"step": 0, "history": [], "bad_in_a_row": 0}
        logger = None
        if self.run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
            logger = MetricsLogger(run_dir, wandb=cfg.wandb, config=cfg.to_dict())
        bar = StepProgress(cfg.steps, enabled=self.progress and main)
        log = RunLog(AlarmMonitor(cfg.steps, AlarmConfig(window=cfg.alarm_window)), logger, bar)
        history, bad_in_a_row = saved["history"], saved["bad_in_a_row"]
        stop = StopRequests() if run_dir is not None else None
        metrics: dict[str, float] = {}
        with bar, stop or nullcontext():
            if history:  # resumed: the start accuracy comes from the checkpoint
                first = EvalResult(accuracy=history[0][1], size=len(self.heldout_prompts))
            else:
                first, seconds = self._evaluate_with(bar)
                history.append((0, first.accuracy))
                log.record(0, {**first.metrics(), "time_eval": seconds})
                bar.print(f"step 0 held-out: {first.describe()}")
            train_start = time.perf_counter()
            for step in range(saved["step"] + 1, cfg.steps + 1):
                metrics = self.step(step)
                if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                    result, seconds = self._evaluate_with(bar)
                    metrics.update({**result.metrics(), "time_eval": seconds})
                    history.append((step, result.accuracy))
                bad_in_a_row = bad_in_a_row + 1 if metrics["nonfinite_skipped"] else 0
                metrics["bad_steps_in_a_row"] = bad_in_a_row
                log.record(step, metrics)
                bar.update(step, metrics)
                if cfg.log_every and step % cfg.log_every == 0:
                    bar.print(summary_line(step, cfg.steps, metrics))
                self._checkpoint_or_stop(step, history, bad_in_a_row, stop)
            train_seconds = time.perf_counter() - train_start
            last, seconds = self._evaluate_with(bar)
            log.record(cfg.steps, {**last.metrics(), "time_eval": seconds})
            bar.print(f"step {cfg.steps} held-out: {last.describe()}")
        if logger is not None:
            logger.close()
        summary = {
            "heldout_accuracy_start": first.accuracy,
            "heldout_accuracy_end": last.accuracy,
            "heldout_size": len(self.heldout_prompts),
            "heldout_start": first.metrics(),
            "heldout_end": last.metrics(),
            "steps": cfg.steps,
            "train_seconds": round(train_seconds, 2),
            "wall_seconds": round(time.perf_counter() - start, 2),
            "reward_mean_last": metrics.get("reward_mean"),
            "alarms": log.raised,
        }
        if run_dir is not None and cfg.save_model:
            state = full_state_dict(self.model, self.world)  # collective under FSDP
            if main:
                save_model(self.model, self.tokenizer, run_dir / "model", state_dict=state)
        if self.run_dir is not None:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    # ---- checkpoints and stopping ----

    def _checkpoint_or_stop(self, step: int, history: list, bad_in_a_row: int, stop: StopRequests | None) -> None:
        """Checkpoint on schedule, at the end, or when asked to stop; stop after too many NaN/inf steps.

        No checkpoint is written after a bad step, so the latest one is the last good state.
        """
        cfg = self.config
        if bad_in_a_row >= cfg.max_bad_steps:
            raise RunStopped(
                f"loss or gradient was NaN/inf in {bad_in_a_row} consecutive steps (the last at step {step}); "
                f"stopped (max_bad_steps={cfg.max_bad_steps}); {self._where()}"
            )
        requested = stop is not None and stop.received is not None
        due = step % cfg.save_every == 0 or step == cfg.steps or requested
        # Under FSDP each rank holds a shard of the weights and optimiser: not checkpointed yet.
        if self.run_dir is not None and due and bad_in_a_row == 0 and not self.world.fsdp:
            try:
                checkpoint.save(
                    self.run_dir, step, model=self.model, owner=self, config=cfg.to_dict(),
                    extra={"history": history, "bad_in_a_row": bad_in_a_row}, keep=cfg.keep_checkpoints,
                )
            except checkpoint.CheckpointError as err:
                raise RunStopped(f"{err}; the run stopped at step {step}") from err
        if requested:
            raise RunStopped(f"stopped by {stop.received.name} after step {step}; {self._where()}",
                             exit_code=128 + int(stop.received))

    def _where(self) -> str:
        path = checkpoint.latest(self.run_dir) if self.run_dir is not None else None
        if path is None:
            return "no checkpoint was written"
        return f"latest checkpoint: {path} (continue with: grpo train --resume {self.run_dir})"

    def _resume(self, run_dir: Path | None) -> dict:
        """Restore the latest complete checkpoint of run_dir; return its step, history and bad-step count."""
        path = checkpoint.latest(run_dir) if run_dir is not None else None
        if path is None:
            raise checkpoint.CheckpointError(f"{run_dir} holds no complete checkpoint to resume from")
        checkpoint.remove_partial(run_dir)
        return checkpoint.restore(path, model=self.model, owner=self)

    def _evaluate_with(self, bar: StepProgress) -> tuple[EvalResult, float]:
        """Evaluate under an evaluation progress bar; return the result and the seconds it took."""
        passes = 1 + (self.config.eval_samples > 0)
        start = time.perf_counter()
        with bar.evaluating(passes * len(self.heldout_prompts)) as advance:
            result = self.evaluate(on_batch=advance)
        return result, time.perf_counter() - start


def default_run_dir(config: TrainConfig) -> Path:
    if config.output:
        return Path(config.output)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{config.task}"


def train(
    config: TrainConfig | None = None,
    *,
    model: nn.Module | None = None,
    tokenizer: object | None = None,
    task: Task | None = None,
    rewards: Sequence[RewardFn | str] | None = None,
    run_dir: str | Path | None = None,
    progress: bool = True,
    **overrides: object,
) -> dict:
    """Python entry point: ``grpo.train(TrainConfig(steps=10), rewards=[my_reward])``."""
    config = replace(config or TrainConfig(), **overrides)
    trainer = GRPOTrainer(config, model=model, tokenizer=tokenizer, task=task, rewards=rewards, progress=progress)
    return trainer.train(Path(run_dir) if run_dir is not None else None)
