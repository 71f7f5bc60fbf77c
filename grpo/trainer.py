"""The GRPO loop, top to bottom.

Each step: sample B prompts (grpo/sampler.py: uniform, or the frontier
sampler) and generate a group of G completions for each, scored
(grpo/batch.py, with DAPO's dynamic sampling); standardise rewards within
each group into advantages (grpo/algorithm.py); update the policy with the
clipped surrogate, plus beta * KL when beta > 0 (grpo/update.py); record
(grpo/step_metrics.py); evaluate on held-out prompts now and then
(grpo/heldout.py); checkpoint (grpo/run_state.py).

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

Under torchrun each process samples and trains on its share of the whole
groups of the same global batch, with the whole batch's advantages and loss
normaliser; every completion draws from a random stream of its own, keyed by
its place in the run, not by the process (grpo/distributed.py,
grpo/streams.py), so the update does not depend on the world size W.

Process-wide settings (seeds, threads, the allocator) are not the trainer's:
call :func:`grpo.process.setup_process` first, as :func:`train` and the CLI do.
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import torch
from torch import Tensor, nn

from grpo.ahead import SamplingAhead
from grpo.alarms import AlarmConfig, AlarmMonitor
from grpo.algorithm import group_advantages
from grpo.batch import Batch, leave_out_errored, sample_and_score, sample_batch
from grpo.combinations import config_trains_adapter, refuse_unbuilt, world_size
from grpo.config import DATA_MAX_NEW_TOKENS, ConfigError, TrainConfig, settle_config
from grpo.distributed import Policy, World, full_state_dict, init_world, shard_policy
from grpo.episodes import make_agent
from grpo.evaluate import EvalResult
from grpo.heldout import (
    evaluate_heldout,
    evaluate_with,
    interim_evaluation,
    subset_accuracy,
    subset_size,
    train_sample_accuracy,
    train_sample_size,
)
from grpo.interrupt import RunStopped, StopRequests
from grpo.memory_check import say_measured_memory
from grpo.metrics import MetricsLogger
from grpo.models import add_lora, load_policy, save_model, trains_adapter
from grpo.preflight import PreflightReport, preflight_summary, run_preflight, step_budget
from grpo.process import pick_device, setup_process
from grpo.progress import StepProgress, errored_line, summary_line
from grpo.prompts import run_prompts, run_task, settle_format
from grpo.rewards import RewardScorer, combine_rewards, resolve_reward
from grpo.rewards.sandbox import check_sandbox, needs_sandbox, set_sandbox
from grpo.rewards.styles import check_style
from grpo.rollout import Rollout
from grpo.run_state import RunState, checkpoint_or_stop, restore
from grpo.sampler import DrawCounts, make_sampler
from grpo.screen import make_screen
from grpo.step_metrics import RunLog, RunTotals, StepTimes, best_completions, step_record, write_samples
from grpo.tasks import Task
from grpo.tools import ToolBox
from grpo.update import StepStats, learning_rate, on_policy, reference_logprobs, update
from grpo.vllm_engine import VLLMEngine, cpu_share

__all__ = ["GRPOTrainer", "default_run_dir", "pick_device", "settle_config", "train"]

RewardFn = Callable[[str, Mapping], float]
EPISODE_OPENING_TOKENS = 1024  # --engine vllm: what an episode's opening may add to the task's prompt


class GRPOTrainer:
    """Trains a causal LM with GRPO. ``model``/``tokenizer``, ``task`` and ``rewards`` may be given
    as objects (the Python API); otherwise they come from the config's names."""

    score: RewardScorer | None = None  # the rewards' scorer, and its worker processes
    checker: RewardScorer | None = None  # the task's checker (the scorer itself when the checker is the reward)
    toolbox: ToolBox | None = None
    engine: VLLMEngine | None = None
    run_dir: Path | None = None  # where rank 0 writes; None on the other ranks
    saving: bool = False  # checkpoints are written (on every process: under FSDP all take part)
    ahead: SamplingAhead | None = None  # async_lag > 0: the batches sampled while the policy trains
    order_rng: random.Random | None = None  # async_lag > 0: the minibatches' order (prompt_rng samples ahead)
    memory: dict | None = None  # the pre-flight check's memory prediction (grpo/memory.py), and the measured peak

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
        tools: Sequence[Callable] | None = None,
        env: Callable | None = None,
    ) -> None:
        # the combinations that are not built, refused before anything loads or forks (grpo/combinations.py)
        adapter = config_trains_adapter(config) if model is None else config.lora_rank > 0 or trains_adapter(model)
        refuse_unbuilt(config, world.size if world is not None else world_size(), adapter=adapter)
        try:
            self._build(config, model, tokenizer, task, rewards, progress, world, tools, env)
        except BaseException:  # what was started (reward, tool workers; the vLLM engine) ends with the failure
            self.close()
            raise

    def _build(self, config: TrainConfig, model: nn.Module | None, tokenizer: object | None, task: Task | None,
               rewards: Sequence[RewardFn | str] | None, progress: bool, world: World | None,
               tools: Sequence[Callable] | None, env: Callable | None) -> None:
        """The trainer's parts, in the order they depend on each other."""
        self.progress = progress
        # the task the config names (or the one given), with its few-shot examples and r1-zero's reward
        self.task = run_task(config, task=task, require_answer=not (rewards or config.rewards))
        # no token limit given and none tuned for the task: the pre-flight check fits one to the data
        self.fit_token_limit = config.max_new_tokens == 0 and "max_new_tokens" not in self.task.defaults
        self.tuned_token_limit = config.max_new_tokens == 0 and "max_new_tokens" in self.task.defaults
        self.auto_alarm_window = config.alarm_window == 0
        self.config = config = settle_config(config, self.task)
        self._build_scorer(rewards)
        self.world = world if world is not None else init_world(config.device, fsdp=config.fsdp)
        if config.prompts_per_step % self.world.size:
            raise ConfigError(
                f"prompts_per_step ({config.prompts_per_step}) must be divisible by the number of "
                f"processes ({self.world.size}): each process samples whole groups"
            )
        self.device = self.world.device if self.world.size > 1 else pick_device(config.device)
        self._build_policy(model, tokenizer, tools, env)
        self.prompt_rng = random.Random(config.seed)
        self.sampler = make_sampler(
            config.sampler, len(self.task.train), config.group_size, rng=self.prompt_rng, seed=config.seed,
            explore_frac=config.explore_frac, half_life=config.sampler_half_life,
            estimator=config.advantage_estimator,
        )
        self.draws = DrawCounts(len(self.task.train))  # which groups are a first try at their prompt
        self.screen = make_screen(config)  # None: each round generates the sampler's draw as it is
        self.totals = RunTotals()  # summary.json's generation totals
        self.train_prompts = run_prompts(self.tokenizer, self.task, self.config, self.task.train)
        self.heldout_prompts = run_prompts(self.tokenizer, self.task, self.config, self.task.heldout)
        self.top_completions: list[tuple[float, str]] = []  # the latest step's, for the checker alarm
        self.engine = self._engine()  # None: the own sampler, on the policy itself
        if config.async_lag:
            self.ahead = SamplingAhead(self, config.async_lag)
            self.order_rng = random.Random(f"minibatch-order-{config.seed}")
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else nullcontext()
        )

    def _build_scorer(self, rewards: Sequence[RewardFn | str] | None) -> None:
        """The reward functions and the scorer that runs them (in worker processes, with a time limit)."""
        config = self.config
        reward_specs = list(rewards) if rewards is not None else list(config.rewards)
        self.reward_fns = [resolve_reward(r) for r in reward_specs] or [self.task.reward]
        # process-wide, before the reward workers fork, so they inherit it
        if needs_sandbox([*self.reward_fns, *([self.task.env] if self.task.env else [])]):
            set_sandbox(check_sandbox(config.sandbox))
        weights = config.reward_weights or (1.0,) * len(self.reward_fns)
        style = config.reward_style if reward_specs else "auto"
        self.score = combine_rewards(
            self.reward_fns, weights, workers=config.reward_workers, timeout=config.reward_timeout,
            on_error=config.on_error, max_completion_tokens=config.max_new_tokens,
            styles=[check_style(fn, style) for fn in self.reward_fns],
        )
        # the task's checker, for held-out accuracy, pre-flight and the step's accuracy: in workers with the
        # same time limit (the reward's own scorer when the checker is the reward)
        self.checker = self.score if self.reward_fns == [self.task.reward] and not config.reward_weights else \
            combine_rewards([self.task.reward], workers=config.reward_workers, timeout=config.reward_timeout)

    def _build_policy(self, model: nn.Module | None, tokenizer: object | None,
                      tools: Sequence[Callable] | None, env: Callable | None) -> None:
        """The policy (loaded, LoRA-wrapped, sharded), its frozen reference, the agent and the optimiser."""
        config = self.config
        if model is None:
            policy = load_policy(config.model, device=self.device)
            model, tokenizer = policy.model, policy.tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        # how rows become prompt tokens: the config names the format (auto resolved) and gains its stop strings
        self.prompt_format, self.config = settle_format(config, tokenizer)
        config = self.config
        # None: single-turn (the one-turn episode is plain sampling); its tool workers fork before CUDA starts
        self.agent, self.toolbox = make_agent(config, self.task, tokenizer, tools=tools, env=env)
        model.to(self.device)
        if config.lora_rank > 0:
            model = add_lora(model, config.lora_rank, config.lora_alpha or None)
        self.model, self.tokenizer = model, tokenizer
        self.world.broadcast_parameters(model)
        self.reference = self._reference_model()
        self.policy = shard_policy(model, self.world)  # calls of the model that FSDP can see
        params = [p for p in model.parameters() if p.requires_grad]
        # the fused kernel updates in place, with none of the foreach path's parameter-sized temporaries
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay,
                                           fused=None if config.fsdp else True)

    def _engine(self) -> VLLMEngine | None:
        """The vLLM engine for ``engine="vllm"`` (started at the first rollout); None for the own sampler."""
        cfg = self.config
        if cfg.engine == "own":
            return None
        # room for the longest prompt and the longest completion any setting may ask for; an episode's
        # opening may add to the prompt (a tool list in the system message): room for that too
        after = cfg.max_episode_tokens + EPISODE_OPENING_TOKENS if self.agent is not None else 0
        longest = max(len(p) for p in self.train_prompts) + max(cfg.max_new_tokens, DATA_MAX_NEW_TOKENS, after)
        # each process samples its own groups with an engine of its own, on its own device (or share of cores)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        cpus = cpu_share(self.world.local_rank, local, os.cpu_count() or 1) if local > 1 else ""
        engine = VLLMEngine(self.model, self.tokenizer, python=cfg.vllm_python, memory=cfg.vllm_memory,
                            seed=cfg.seed, max_model_len=longest, cpus=cpus,
                            sleep=cfg.vllm_sleep and self.device.type == "cuda" and not cfg.async_lag,
                            bucket_mb=cfg.vllm_bucket_mb)  # sampling ahead: vLLM works while the policy trains
        if self.world.fsdp:  # the weights vLLM starts from, gathered now (collective): every process is here
            engine.push(self.model, full_state_dict(self.model, self.world))
        return engine

    def close(self) -> None:
        """End what the trainer started outside its process: the reward and tool workers, the vLLM engine."""
        try:
            if self.ahead is not None:
                self.ahead.close()
        finally:
            self._close_workers()

    def _close_workers(self) -> None:
        for part in (self.score, self.checker, self.toolbox, self.engine):  # None: not started
            if part is not None:
                part.close()

    def _reference_model(self) -> Policy | None:
        """The frozen reference for the KL term (sharded as the policy is); none when beta = 0.
        LoRA reuses the base weights."""
        if self.config.beta == 0.0 or trains_adapter(self.model):
            return None
        ref = copy.deepcopy(self.model).eval()
        ref.requires_grad_(False)
        return shard_policy(ref, self.world)

    # ---- one GRPO step, in the algorithm's order ----

    def step(self, step: int) -> dict[str, float]:
        """Sample and score a batch (or take the one sampled ahead), compute group advantages, update the
        policy, push it to the engine."""
        cfg = self.config
        t0 = time.perf_counter()
        if self.ahead is None:
            batch, waits = self.sample_batch(step), {}
        else:  # sampled K updates ago; batches up to step + K are sampled meanwhile
            batch, waits = self.ahead.next_batch(step, cfg.steps)
        t_turn = time.perf_counter()
        with self.ahead.turns if self.ahead is not None else nullcontext():  # the own engine's turn ends first
            if waits:
                waits["time_wait_sampler"] += time.perf_counter() - t_turn
            return self._train_on(step, batch, waits, t0)

    def _train_on(self, step: int, batch: Batch, waits: dict[str, float], t0: float) -> dict[str, float]:
        """The update on a sampled batch, and the step's record."""
        cfg = self.config
        t_scored = time.perf_counter()
        if self.engine is not None and self.ahead is None:  # on a GPU the update gets vLLM's memory
            self.engine.sleep()
        valid = leave_out_errored(self, batch)  # (N,) errored rows leave the loss and their group's statistics
        advantages = batch.rewards.float()  # (0,): filter_groups may find no informative group in its rounds
        stats = StepStats()
        if batch.rewards.numel():
            advantages = group_advantages(batch.rewards, cfg.group_size, estimator=cfg.advantage_estimator,
                                          scale=cfg.scale, valid=valid, mask=batch.lengths)  # (N,)
            ref_logp = reference_logprobs(self, batch.rollout)
            self.model.train()
            for group in self.optimizer.param_groups:
                group["lr"] = self.learning_rate(step)
            stats = self.update(batch.rollout, advantages, ref_logp, batch.lengths)
        t_updated = time.perf_counter()
        if self.ahead is None:  # sampling ahead takes the weights at the next step's start
            self._push_weights(stats)
        self.top_completions = best_completions(self, batch)
        if cfg.sample_every and step % cfg.sample_every == 0:
            write_samples(self, step, batch, advantages)
        record = step_record(self, step, batch, advantages, stats, StepTimes(t0, t_scored, t_updated,
                                                                              time.perf_counter()))
        if waits:  # the thread's own times for the batch (its push in time_sync), not the trainer's wait for it
            waits["time_reward"] = waits.pop("time_sample") - record["time_generate"]
        return {**record, **waits}

    def _push_weights(self, stats: StepStats) -> None:
        """Send the updated weights to the vLLM engine, if there is one and they changed."""
        if self.engine is not None and self.engine.asleep:  # the gradients' memory goes back before vLLM wakes
            self.optimizer.zero_grad(set_to_none=True)
        if self.engine is not None and stats.optimizer_steps:  # the next rollout samples from the new weights
            self.engine.push(self.model, full_state_dict(self.model, self.world))  # collective under FSDP

    # the phases of a step, by name (grpo/batch.py, grpo/update.py, grpo/heldout.py hold them)

    def sample_batch(self, step: int) -> Batch:
        return sample_batch(self, step)

    def sample_and_score(self, prompts: Sequence[int], generator: torch.Generator | None = None,
                         stop_early: Callable[[int, int], bool] | None = None, *, streams: Tensor | None = None,
                         ) -> tuple[Rollout, Tensor, dict[str, float], float]:
        return sample_and_score(self, prompts, generator, stop_early, streams=streams)

    def update(self, rollout: Rollout, advantages: Tensor, ref_logp: Tensor | None, lengths: Tensor) -> StepStats:
        return update(self, rollout, advantages, ref_logp, lengths)

    def learning_rate(self, step: int) -> float:
        return learning_rate(self.config, step)

    @property
    def on_policy(self) -> bool:
        return on_policy(self.config)

    def evaluate(self, on_batch: Callable[[int], None] | None = None, limit: int | None = None) -> EvalResult:
        return evaluate_heldout(self, on_batch, limit)

    # ---- the run ----

    def train(self, run_dir: Path | None = None, *, resume: bool = False) -> dict:
        """Run config.steps GRPO steps with held-out evaluation before, after and every eval_every
        steps; watch the alarms; return the summary.

        A new run starts with the pre-flight check (grpo/preflight.py), which may fit the token
        limit or stop the run (RunStopped) before anything is trained. With early_stop, a
        stopping alarm (grpo/alarms.py) ends the loop early; the final evaluation still runs.
        With a run_dir, checkpoints are written every save_every steps and at the end, and
        SIGINT/SIGTERM stop the run after the current step with a checkpoint (RunStopped).
        ``resume`` continues run_dir from its latest checkpoint, exactly as if never stopped.
        """
        self.run_dir = run_dir if self.world.is_main else None  # only rank 0 writes
        self.saving = run_dir is not None
        start = time.perf_counter()
        state = self._resume(run_dir) if resume else None
        preflight = None if resume or self.config.preflight == "off" else self._preflight()
        state = state or RunState.start(self.config, auto_alarm_window=self.auto_alarm_window)  # config final
        log = self._open_log(state)
        stop = StopRequests(announce=self.world.is_main) if run_dir is not None else None
        try:
            with log.bar, stop or nullcontext():
                first, seconds = self._first_evaluation(log, state)
                train_start = time.perf_counter()
                metrics, stopped, out_of_time = self._run_steps(log, state, stop)
                train_seconds = time.perf_counter() - train_start
                last, seconds = evaluate_with(self, log.bar)
                log.record(state.step, {**last.metrics(), **subset_accuracy(self, last), "time_eval": seconds,
                                        **train_sample_accuracy(self, log.bar)}, final=True)
                log.bar.print(f"step {state.step} held-out: {last.describe()}")
        finally:  # also when the run stops with an error: the TensorBoard writer's thread ends here
            if log.logger is not None:
                log.logger.close()
        summary = {
            "heldout_accuracy_start": first.accuracy, "heldout_accuracy_end": last.accuracy,
            "heldout_size": len(self.heldout_prompts), "heldout_start": first.metrics(),
            "heldout_end": last.metrics(), "steps": state.step, "steps_planned": self.config.steps,
            "minutes": self.config.minutes, "out_of_time": out_of_time, "stopped_early": stopped,
            "train_seconds": round(train_seconds, 2), "wall_seconds": round(time.perf_counter() - start, 2),
            "reward_mean_last": metrics.get("reward_mean"), "alarms": log.raised, "alarm_messages": log.messages,
            "eval_every": state.eval_every, "alarm_window": state.alarm_window,
            "preflight": preflight_summary(preflight), "generation": self.totals.summary(),
        }
        self._save_final(run_dir, summary)
        return summary

    def _run_steps(self, log: RunLog, state: RunState, stop: StopRequests | None
                   ) -> tuple[dict[str, float], str | None, bool]:
        """The steps, each recorded, evaluated on schedule and checkpointed, until the last one, a stopping
        alarm or the time budget; the last step's metrics, why it stopped early, whether out of time."""
        cfg, world = self.config, self.world
        metrics: dict[str, float] = {}
        stopped, out_of_time, first_step = None, False, state.step
        train_start, trained_before = time.perf_counter(), state.train_seconds
        trained = lambda: trained_before + time.perf_counter() - train_start  # noqa: E731
        for step in range(first_step + 1, cfg.steps + 1):
            metrics = self.step(step)
            self.totals.add(metrics)
            if step == first_step + 1:
                say_measured_memory(self, step)
            if state.eval_every > 0 and step % state.eval_every == 0 and step < cfg.steps:
                if self.ahead is not None:  # the evaluation uses the checker, tools and engine the thread uses
                    self.ahead.drain()
                metrics.update(interim_evaluation(self, log.bar))
                state.history.append((step, metrics["heldout_subset_accuracy"]))
            state.step, state.bad_in_a_row = step, state.bad_in_a_row + 1 if metrics["nonfinite_skipped"] else 0
            metrics["bad_steps_in_a_row"] = state.bad_in_a_row
            log.record(step, metrics)
            log.bar.update(step, metrics)
            if cfg.log_every and step % cfg.log_every == 0:
                log.bar.print(summary_line(step, cfg.steps, metrics))
            if (said := errored_line(step, metrics)) is not None:
                log.bar.print(said)
            # rank 0's verdict binds all, so that no rank leaves the loop alone
            stopped = world.broadcast_object(log.monitor.stopping() if cfg.early_stop else None)
            # the time budget: stop where the next step, at the mean pace so far, would end past it
            out_of_time = bool(cfg.minutes) and step < cfg.steps and world.broadcast_object(
                trained() + (trained() - trained_before) / (step - first_step) > 60 * cfg.minutes)
            if (stopped or out_of_time) and self.ahead is not None:  # no batch is sampled that no step trains on
                self.ahead.close()
            # a signal to any rank stops every rank after this step (the ranks' MAX, like the verdicts above)
            requested = stop.agreed(world.max) if stop is not None else None
            checkpoint_or_stop(self, step, state.extra(log.monitor, trained()), requested,
                               final=stopped is not None or out_of_time)
            if stopped or out_of_time:
                log.bar.print(f"stopping early after step {step} of {cfg.steps} (early_stop): {stopped}" if stopped
                              else f"time budget of {cfg.minutes:g} minutes of training reached after step {step} "
                                   f"(of at most {cfg.steps}; --minutes sets it, 0 for none)")
                break
        if self.ahead is not None:  # batches beyond the last step trained are not sampled
            self.ahead.close()
        return metrics, stopped, out_of_time

    def _open_log(self, state: RunState) -> RunLog:
        """config.json, the metrics sinks, the progress bar and the alarms (with a resumed run's history)."""
        cfg, logger = self.config, None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
            logger = MetricsLogger(self.run_dir, wandb=cfg.wandb, config=cfg.to_dict())
        main = self.world.is_main
        bar = StepProgress(cfg.steps, enabled=self.progress and main, silent=not main)
        alarms = AlarmConfig(window=state.alarm_window, no_signal_steps=cfg.no_signal_steps,
                             heldout_n=subset_size(self), train_n=train_sample_size(self), sampler=cfg.sampler,
                             full_n=len(self.heldout_prompts))
        answered = all(str(row.get("answer") or "").strip() for row in self.task.heldout)
        monitor = AlarmMonitor(cfg.steps, alarms, watch_heldout=answered)
        monitor.load_state(state.alarms)  # a resumed run's alarms see the steps before it
        return RunLog(monitor, logger, bar, explain={"checker_suspected": self._top_completions})

    def _first_evaluation(self, log: RunLog, state: RunState) -> tuple[EvalResult, float]:
        """The held-out accuracy before training (a resumed run's comes from its checkpoint)."""
        if state.history:
            return EvalResult(accuracy=state.history[0][1], size=len(self.heldout_prompts)), 0.0
        first, seconds = evaluate_with(self, log.bar)
        state.history.append((0, first.accuracy))
        log.record(0, {**first.metrics(), **subset_accuracy(self, first), "time_eval": seconds,
                       **train_sample_accuracy(self, log.bar)})
        log.bar.print(f"step 0 held-out: {first.describe()}")
        return first, seconds

    def _save_final(self, run_dir: Path | None, summary: dict) -> None:
        """The final model (gathered under FSDP, written by rank 0) and summary.json."""
        if run_dir is not None and self.config.save_model:
            state = full_state_dict(self.model, self.world)  # collective under FSDP
            if self.world.is_main:
                save_model(self.model, self.tokenizer, run_dir / "model", state_dict=state)
        if self.run_dir is not None:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def _preflight(self) -> PreflightReport:
        """Run the pre-flight check; adopt a fitted token limit; stop when the mode says so."""
        report = run_preflight(self, fit=self.fit_token_limit)
        self.memory = report.memory
        # every rank sampled the same draws; rank 0's verdict and limit bind all, so none can diverge
        report.problems, report.fitted_max_new_tokens = self.world.broadcast_object(
            (report.problems, report.fitted_max_new_tokens))
        if self.world.is_main:
            print(report.describe(), flush=True)
            if self.run_dir is not None:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                (self.run_dir / "preflight.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        fatal = report.stops(self.config.preflight)
        if fatal:
            where = f" (report: {self.run_dir / 'preflight.json'})" if self.run_dir is not None else ""
            raise RunStopped(f"pre-flight check: {fatal[0].message}{where}", exit_code=1)
        if report.fitted_max_new_tokens is not None:  # before the first step: the config is not frozen yet
            self.config = replace(self.config, max_new_tokens=report.fitted_max_new_tokens)
            self.score.max_completion_tokens = report.fitted_max_new_tokens
        self._apply_step_budget(report)
        return report

    def _apply_step_budget(self, report: PreflightReport) -> None:
        """Print the steps that fit in --minutes; adapt what the user did not set when too few do."""
        cfg = self.config
        untouched = {name for name in ("max_gen_rounds", "group_size")
                     if name not in cfg.set_by_user and getattr(cfg, name) == TrainConfig.__dataclass_fields__[name].default}
        changes = self.world.broadcast_object(
            step_budget(report, cfg, untouched | ({"max_new_tokens"} if self.fit_token_limit else set())))
        if self.world.is_main:
            for line in report.budget(cfg.minutes):
                print(line, flush=True)
            if self.run_dir is not None:  # with the budget's lines; config.json, written next, has the values
                (self.run_dir / "preflight.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if not changes:
            return
        self.config = replace(cfg, **changes)
        self.score.max_completion_tokens = self.config.max_new_tokens
        if "group_size" in changes:  # the sampler draws groups of the new size, from the same seed
            self.prompt_rng = random.Random(self.config.seed)
            self.sampler = make_sampler(
                self.config.sampler, len(self.task.train), self.config.group_size, rng=self.prompt_rng,
                seed=self.config.seed, explore_frac=self.config.explore_frac, half_life=self.config.sampler_half_life,
                estimator=self.config.advantage_estimator)
            self.screen = make_screen(self.config)

    def _resume(self, run_dir: Path | None) -> RunState:
        """Restore the latest complete checkpoint of run_dir; the engine samples from its weights."""
        saved = restore(self, run_dir)
        if self.engine is not None:  # collective under FSDP
            self.engine.push(self.model, full_state_dict(self.model, self.world))
        return RunState.resumed(saved, self.config)

    def _top_completions(self) -> str:
        """The latest step's highest-scoring completions, for the checker-suspected alarm."""
        shown = "; ".join(f"{r:.2f} for {text!r}" for r, text in self.top_completions)
        return f"; top-scoring completions: {shown}" if shown else ""


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
    tools: Sequence[Callable] | None = None,
    env: Callable | None = None,
    **overrides: object,
) -> dict:
    """Python entry point: ``grpo.train(TrainConfig(steps=10), rewards=[my_reward])``; ``tools=[fn, ...]``
    or ``env=MyEnv`` (a class or factory: one environment per episode) make the episodes multi-turn."""
    config = replace(config or TrainConfig(), **overrides)
    setup_process(config)
    trainer = GRPOTrainer(config, model=model, tokenizer=tokenizer, task=task, rewards=rewards, progress=progress,
                          tools=tools, env=env)
    try:
        return trainer.train(Path(run_dir) if run_dir is not None else None)
    finally:
        trainer.close()
