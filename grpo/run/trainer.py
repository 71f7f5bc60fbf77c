"""The GRPO loop, top to bottom.

Each step: take the step's batch from the batch source (grpo/run/batch_source.py: sampled at the step, or
ahead in a thread, grpo/run/async_batches.py): B prompts (grpo/sampling/prompt_samplers.py: uniform, or the
frontier sampler), a group of G completions for each, scored (grpo/sampling/rounds.py, with DAPO's dynamic
sampling); standardise rewards within each group into advantages (grpo/math/algorithm.py); update the policy
with the clipped surrogate, plus beta * KL when beta > 0 (grpo/learning/update.py); record
(grpo/run/step_metrics.py); evaluate on held-out prompts now and then (grpo/observe/heldout.py); checkpoint
(grpo/run/run_state.py).

Deviations from DeepSeekMath's GRPO, all configurable:
- the default aggregation is per token over the batch (DAPO), not the mean of per-sequence means;
- the default clip is asymmetric (DAPO's clip-higher: 0.2 below, 0.28 above);
- no KL penalty by default (beta = 0), so no reference model is loaded;
- a group whose rewards are all equal has zero advantages and, with beta = 0, contributes exactly nothing to
  the gradient, so its forward and backward passes are skipped (the loss normaliser still counts its tokens,
  so the update is unchanged); a step where every group is like that makes no optimiser update at all;
- an optimiser step whose loss or gradient is NaN/inf is skipped (and counted as nonfinite_skipped);
  max_bad_steps such steps in a row stop the run.

Checkpoints (grpo/run/checkpoint.py) make a resumed run bitwise the same as an unbroken one. Under torchrun
each process samples and trains on its share of the whole groups of the same global batch, with the whole
batch's advantages and loss normaliser; every completion draws from a random stream of its own, keyed by its
place in the run, not by the process (grpo/system/distributed.py, grpo/sampling/random_streams.py), so the
update does not depend on the world size W.

Process-wide settings (seeds, threads, the allocator) are not the trainer's: call
:func:`grpo.run.process_setup.setup_process` first, as :func:`grpo.train` (grpo/api.py) and the CLI do.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from grpo.config import STANDING, TrainConfig, with_given
from grpo.config_resolution import settle_config
from grpo.learning.step_stats import StepStats
from grpo.learning.teacher.scoring import load_teacher
from grpo.learning.update import learning_rate, reference_logprobs, update
from grpo.math.algorithm import adapted_temperature, group_advantages
from grpo.observe.heldout import full_evaluation, interim_evaluation
from grpo.run.batch_source import batch_source
from grpo.run.build import (
    RunSetup,
    build_engine,
    build_policy,
    build_scorer,
    default_run_dir,
    load_model,
    preflight_may_change,
    preflight_verdict,
)
from grpo.run.memory_check import say_measured_memory
from grpo.run.preflight import PreflightReport, run_preflight
from grpo.run.process_setup import gpu_autocast, pick_device
from grpo.run.repeat import measured_line
from grpo.run.run_ends import first_evaluation, resumed_state, run_summary, save_final
from grpo.run.run_state import RunState, Saving, TimeBudget, checkpoint_or_stop
from grpo.run.step_metrics import (
    RunLog,
    RunTotals,
    StepTimes,
    best_completions,
    open_log,
    step_record,
    top_completions_note,
    write_samples,
)
from grpo.sampling.episodes import make_agent
from grpo.sampling.prompt_samplers import DrawCounts, make_sampler
from grpo.sampling.prompts import format_task, loaded_format, run_prompts
from grpo.sampling.rounds import Batch, leave_out_errored
from grpo.sampling.screen import make_screen
from grpo.sampling.step_parts import Drawing, Generation, Learner, Sampling, Scoring, Temperature
from grpo.system.distributed import World, init_world, use_device
from grpo.system.interrupt import StopRequests

__all__ = ["GRPOTrainer", "default_run_dir", "pick_device", "settle_config"]


class GRPOTrainer:
    """Trains a causal LM with GRPO: the run that grpo.run.build.resolve_run resolved (its config, task and
    rewards). ``model``/``tokenizer`` may be given as objects (the Python API); otherwise they come from the
    config's name."""

    score = checker = toolbox = engine = None  # what runs outside the process (closed by close()), once built
    batches = None  # where each step's batch comes from (grpo/run/batch_source.py), once built
    run_dir: Path | None = None  # where rank 0 writes; None on the other ranks
    saving: bool = False  # checkpoints are written (on every process: under FSDP all take part)
    memory: dict | None = None  # the pre-flight check's memory prediction (grpo/run/memory.py), and the measured peak
    config: TrainConfig | None = None  # the config the steps run with, once settled (_settle assigns it once)

    def __init__(self, run: RunSetup, *, model: nn.Module | None = None, tokenizer: object | None = None,
                 progress: bool = True, world: World | None = None, tools: Sequence[Callable] | None = None,
                 env: Callable | None = None) -> None:
        try:
            self._build(run, model, tokenizer, progress, world, tools, env)
        except BaseException:  # what was started (reward, tool workers; the vLLM engine) ends with the failure
            self.close()
            raise

    def _build(self, run: RunSetup, model: nn.Module | None, tokenizer: object | None, progress: bool,
               world: World | None, tools: Sequence[Callable] | None, env: Callable | None) -> None:
        """The trainer's parts, in the order they depend on each other."""
        self.progress = progress
        config = run.config
        self.task = format_task(run.task, config)  # the resolved task: its few-shot examples, r1-zero's reward
        self.sources = dict(run.sources)  # where each value came from (config.json); the pre-flight's added
        # no token limit given and none tuned for the task: the pre-flight check fits one to the data
        self.fit_token_limit = self.sources.get("max_new_tokens") == "default"
        self.tuned_token_limit = self.sources.get("max_new_tokens") in ("task", "data")
        self.auto_alarm_window = self.sources.get("alarm_window") == "default"
        # the given tools and environment, else those the config's files hold (imported once, by resolve_run)
        tools, env = tools if tools is not None else run.tools, env or run.env
        self.reward_fns, self.score, self.checker = build_scorer(config, self.task, run.rewards, env)
        self.world = world if world is not None else init_world(config.device, fsdp=config.fsdp)
        self.device = self.world.device if self.world.size > 1 else pick_device(config.device)
        # loaded on the CPU: build_policy moves it (under FSDP, its shards) once the tool workers have forked
        model, self.tokenizer = load_model(config, torch.device("cpu"), model, tokenizer)
        # how rows become prompt tokens: the format resolve_run settled (auto only where no file told: settled now)
        self.prompt_format, config, self.sources = loaded_format(config, self.sources, self.tokenizer)
        # None: single-turn (the one-turn episode is plain sampling); its tool workers fork before CUDA starts
        self.agent, self.toolbox = make_agent(config, self.task, self.tokenizer, tools=tools, env=env)
        use_device(self.device)  # the run's first CUDA call, after every worker pool has forked
        self.model, self.policy, self.reference, self.optimizer = build_policy(config, self.world, self.device, model)
        self.teacher = load_teacher(config, self.model, self.reference and self.reference.model, self.tokenizer,
                                    self.device)  # None: no distillation (grpo/learning/teacher/)
        self.totals = RunTotals()  # summary.json's generation totals
        self.train_prompts = run_prompts(self.tokenizer, self.task, config, self.task.train)
        self.heldout_prompts = run_prompts(self.tokenizer, self.task, config, self.task.heldout)
        self.top_completions: list[tuple[float, str]] = []  # the latest step's, for the checker alarm
        self.engine = build_engine(config, self.world, self.device, self.model, self.tokenizer, self.agent,
                                   self.train_prompts)  # None: the own sampler, on the policy itself
        self.autocast = gpu_autocast(self.device)
        # the run's sampling temperature, which temperature_target adapts: state, not configuration
        self.temperature = Temperature(config.temperature)
        self.draft = config  # the config as the pre-flight check samples with it, before what it fits
        if preflight_may_change(config, fit=self.fit_token_limit):  # settled in train(), after the check
            # until then the sides are the check's, with no prompt sampler (it draws its own prompts)
            self.sampling, self.learner = self._sides(config, Drawing(), random.Random(config.seed))
        else:
            self._settle(config)

    def _settle(self, config: TrainConfig) -> None:
        """The config the steps run with (assigned here, once; nothing changes it later), and what is built from
        it: the prompt sampler (and its RNG), the draw counts, the screen, the two sides of a step and the batch source."""
        self.config = config
        self.prompt_rng = random.Random(config.seed)
        self.sampler = make_sampler(
            config.sampler, len(self.task.train), config.group_size, rng=self.prompt_rng, seed=config.seed,
            explore_frac=config.explore_frac, half_life=config.sampler_half_life,
            estimator=config.advantage_estimator,
        )
        self.draws = DrawCounts(len(self.task.train))  # which groups are a first try at their prompt
        self.screen = make_screen(config)  # None: each round generates the sampler's draw as it is
        # sampling ahead, the minibatches' order has an RNG of its own (prompt_rng draws in the thread)
        order_rng = random.Random(f"minibatch-order-{config.seed}") if config.async_lag else self.prompt_rng
        drawing = Drawing(sampler=self.sampler, draws=self.draws, screen=self.screen)
        self.sampling, self.learner = self._sides(config, drawing, order_rng)
        self.batches = batch_source(self.sampling, self.learner, config.async_lag)

    def _sides(self, config: TrainConfig, drawing: Drawing, order_rng: random.Random) -> tuple[Sampling, Learner]:
        """The two sides of a step (grpo/sampling/step_parts.py) over the trainer's parts, with this config."""
        generation = Generation(world=self.world, device=self.device, tokenizer=self.tokenizer, model=self.model,
                                policy=self.policy, autocast=self.autocast, temperature=self.temperature,
                                agent=self.agent, toolbox=self.toolbox, engine=self.engine)
        scoring = Scoring(score=self.score, checker=self.checker, reward_fns=self.reward_fns)
        return (Sampling(config=config, task=self.task, train_prompts=self.train_prompts,
                         heldout_prompts=self.heldout_prompts, generation=generation, scoring=scoring, drawing=drawing),
                Learner(config, self.world, self.model, self.policy, self.reference, self.optimizer, self.tokenizer,
                        self.autocast, order_rng, self.temperature, self.teacher))

    def checkpoint_parts(self) -> dict[str, object]:
        """The run's state besides the weights and the optimiser's, by name, as a checkpoint holds it
        (grpo/run/checkpoint.py: a new part raises its FORMAT)."""
        parts = {"prompt_rng": self.prompt_rng, "sampler": self.sampler, "draws": self.draws, "totals": self.totals,
                 "batches": self.batches}
        if self.learner.order_rng is not self.prompt_rng:  # sampling ahead
            parts["order_rng"] = self.learner.order_rng
        if self.screen is not None:
            parts["screen"] = self.screen
        return parts

    def close(self) -> None:
        """End what the trainer started outside its process: the reward and tool workers, the vLLM engine."""
        try:
            if self.batches is not None:
                self.batches.close()
        finally:
            for part in (self.score, self.checker, self.toolbox, self.engine):  # None: not started
                if part is not None:
                    part.close()

    # ---- one GRPO step, in the algorithm's order ----

    def step(self, step: int) -> dict[str, float]:
        """Take the step's batch (sampled now, or ahead), compute group advantages, update the policy on it,
        record the step."""
        t0 = time.perf_counter()
        if self.config is None:  # stepped by hand, without train(): no pre-flight, the config as given
            self._settle(self.draft)
        batch, waits = self.batches.next(step)
        with self.batches.turn(waits):  # sampling ahead with the own engine: once the thread's turn ends
            t_scored = time.perf_counter()
            cfg = self.config
            batch, valid = leave_out_errored(batch, self.world, group_size=cfg.group_size,
                                             estimator=cfg.advantage_estimator)  # errored rows leave the update
            advantages = batch.rewards.float()  # (0,): filter_groups may find no informative group in its rounds
            stats = StepStats()
            if batch.rewards.numel():
                advantages = group_advantages(batch.rewards, cfg.group_size, estimator=cfg.advantage_estimator,
                                              scale=cfg.scale, valid=valid, mask=batch.lengths)  # (N,)
                stats = self._update(step, batch, advantages)
            t_updated = time.perf_counter()
            self.batches.updated(stats)  # the synchronous loop's vLLM engine gets the new weights
            record = self._record(step, batch, advantages, stats, StepTimes(t0, t_scored, t_updated, 0.0))
        return {**record, **waits}

    def _update(self, step: int, batch: Batch, advantages: Tensor) -> StepStats:
        """The policy's update on the batch, at the step's learning rate (with the reference's log-probs
        for the KL term)."""
        ref_logp = reference_logprobs(self.learner, batch.rollout)
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.config, step)
        return update(self.learner, batch.rollout, advantages, ref_logp, batch.lengths)

    def _record(self, step: int, batch: Batch, advantages: Tensor, stats: StepStats, times: StepTimes
                ) -> dict[str, float]:
        """The step's metrics; its best completions (for the checker alarm) and, on schedule, every one."""
        cfg = self.config
        self.top_completions = best_completions(batch, cfg.group_size)
        if cfg.sample_every and step % cfg.sample_every == 0:
            write_samples(step, batch, advantages, group_size=cfg.group_size, world=self.world, run_dir=self.run_dir)
        times.end = time.perf_counter()
        return step_record(self.sampling, step, batch, advantages, stats, times)

    # ---- the run ----

    def train(self, run_dir: Path | None = None, *, resume: bool = False) -> dict:
        """Run config.steps GRPO steps with held-out evaluation before, after and every eval_every
        steps; watch the alarms; return the summary.

        A new run starts with the pre-flight check (grpo/run/preflight.py), which may fit the token
        limit or stop the run (RunStopped) before anything is trained. With early_stop, a
        stopping alarm (grpo/observe/alarms.py) ends the loop early; the final evaluation still runs.
        With a run_dir, checkpoints are written every save_every steps and at the end, and
        SIGINT/SIGTERM stop the run after the current step with a checkpoint (RunStopped).
        ``resume`` continues run_dir from its latest checkpoint, exactly as if never stopped.
        """
        self.run_dir = run_dir if self.world.is_main else None  # only rank 0 writes
        self.saving = run_dir is not None
        start = time.perf_counter()
        preflight, changes = (None, {}) if resume or self.draft.preflight == "off" else self._preflight()
        if self.config is None:  # the check could change it: settled now, once, with what it fitted and adapted
            self.sources.update(dict.fromkeys(changes, "preflight"))
            self._settle(with_given(replace(self.draft, **changes), self.draft.given))
        elif changes and self.world.is_main:  # step() ran by hand first, with the config as given: kept
            print(f"pre-flight: {sorted(changes)} not adopted: steps already ran with the config as given", flush=True)
        if self.world.is_main and (measured := measured_line(self.config, self.sources)):
            print(measured, flush=True)  # what may differ on another machine (grpo/run/repeat.py)
        state = (resumed_state(self.learner, self.checkpoint_parts(), run_dir, self.engine, self.model, self.world,
                                self.config, self.sources, self.temperature) if resume
                 else RunState.start(self.config, auto_alarm_window=self.auto_alarm_window))
        log = open_log(self.sampling, self.run_dir, state, progress=self.progress,
                       explain={"checker_suspected": lambda: top_completions_note(self.top_completions)},
                       sources=self.sources)
        stop = StopRequests(announce=self.world.is_main) if run_dir is not None else None
        try:
            with log.bar, stop or nullcontext():
                began = TimeBudget.now()
                first = first_evaluation(self.sampling, log, state, len(self.heldout_prompts))
                budget = TimeBudget(60 * self.config.minutes, state.train_seconds, TimeBudget.now() - began)
                metrics, stopped, out_of_time = self._run_steps(log, state, stop, budget)
                train_seconds = budget.now() - budget.start
                last, record = full_evaluation(self.sampling, log.bar)
                log.record(state.step, record, final=True)
                log.bar.print(f"step {state.step} held-out: {last.describe()}")
        finally:  # also when the run stops with an error: the TensorBoard writer's thread ends here
            if log.logger is not None:
                log.logger.close()
        summary = run_summary(self.config, self.sources, self.task, self.totals, state, log, preflight, metrics,
                              len(self.heldout_prompts), first=first, last=last, stopped=stopped,
                              out_of_time=out_of_time, train_seconds=train_seconds, start=start)
        save_final(self.model, self.tokenizer, self.world, self.config, run_dir, self.run_dir, summary)
        return summary

    def _run_steps(self, log: RunLog, state: RunState, stop: StopRequests | None, budget: TimeBudget
                   ) -> tuple[dict[str, float], str | None, bool]:
        """The steps, each recorded, evaluated on schedule and checkpointed, until the last one, a stopping
        alarm or the time budget; the last step's metrics, why it stopped early, whether out of time."""
        cfg, world = self.config, self.world
        metrics: dict[str, float] = {}
        stopped, out_of_time, first_step = None, False, state.step
        for step in range(first_step + 1, cfg.steps + 1):
            metrics = self.step(step)
            self.totals.add(metrics)
            if cfg.temperature_target:  # the next step's temperature, from this one's entropy (same on every rank)
                state.temperature = self.temperature.value = adapted_temperature(
                    self.temperature.value, metrics["entropy"], cfg.temperature_target)
            if step == first_step + 1:
                self.memory = say_measured_memory(self.memory, step, self.device.type, self.run_dir, main=world.is_main)
            due = state.eval_every > 0 and step % state.eval_every == 0 and step < cfg.steps
            # the time budget, read before the step's evaluation (grpo.run.run_state.TimeBudget; rank 0's binds all)
            out_of_time = bool(cfg.minutes) and step < cfg.steps and world.broadcast_object(
                budget.spent(step - first_step, due))
            if due and not out_of_time:
                self.batches.drain()  # the evaluation uses the checker, tools and engine that sampling ahead uses
                began = budget.now()
                metrics.update(interim_evaluation(self.sampling, log.bar))
                budget.evaluated(budget.now() - began)
                state.history.append((step, metrics["heldout_subset_accuracy"]))
            state.step, state.bad_in_a_row = step, state.bad_in_a_row + 1 if metrics["nonfinite_skipped"] else 0
            metrics["bad_steps_in_a_row"] = state.bad_in_a_row
            log.step(step, metrics, steps=cfg.steps, log_every=cfg.log_every)
            # rank 0's verdict binds all, so that no rank leaves the loop alone
            stopped = world.broadcast_object(log.monitor.stopping() if cfg.early_stop else None)
            if stopped or out_of_time:  # no batch is sampled that no step trains on
                self.batches.close()
            # a signal to any rank stops every rank after this step (the ranks' MAX, like the verdicts above)
            requested = stop.agreed(world.max) if stop is not None else None
            checkpoint_or_stop(Saving(self.learner, self.checkpoint_parts(), self.run_dir, self.saving), step,
                               state.extra(log.monitor, budget.trained()), requested, final=stopped is not None or out_of_time)
            if stopped or out_of_time:
                log.bar.print(f"stopping early after step {step} of {cfg.steps} (early_stop): {stopped}" if stopped
                              else f"time budget of {cfg.minutes:g} minutes of training reached after step {step} "
                                   f"(of at most {cfg.steps}; --minutes sets it, 0 for none)")
                break
        self.batches.close()  # batches beyond the last step trained are not sampled
        return metrics, stopped, out_of_time

    def _preflight(self) -> tuple[PreflightReport, dict[str, int]]:
        """Run the pre-flight check on the draft config; stop when the mode says so; the report, and the
        config's changes: a fitted token limit and what the step budget adapts."""
        report = run_preflight(self.sampling, self.learner, fit=self.fit_token_limit,
                               tuned_limit=self.tuned_token_limit)
        report.data = dict(self.task.data)  # preflight.json says which rows were checked
        self.memory = report.memory
        adaptable = [name for name in ("max_gen_rounds", "group_size") if self.sources.get(name) not in STANDING]
        return report, preflight_verdict(report, self.draft, self.world, self.run_dir, fit=self.fit_token_limit,
                                         adaptable=adaptable)
