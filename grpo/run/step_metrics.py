"""What a step records: raw reward, where the compute went, the update's statistics, timings; and
where each step's metrics go (through the alarms, to the sinks).

Advantages are relative within a group, so they never show whether the
policy improves: every step logs the raw reward, each reward function's mean,
and the share of groups whose rewards were all equal (they teach nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from grpo.config import TrainConfig
from grpo.learning.step_stats import StepStats
from grpo.learning.update import learning_rate
from grpo.math.algorithm import group_varies
from grpo.observe.alarm_monitor import AlarmMonitor
from grpo.observe.alarms import NOTES, AlarmConfig, little_signal
from grpo.observe.heldout import subset_size, train_sample_size
from grpo.observe.metrics import MetricsLogger, repeated_ngram_frac
from grpo.observe.progress import StepProgress, errored_line, summary_line
from grpo.run.run_state import RunState
from grpo.sampling.episode_scores import episode_metrics
from grpo.sampling.evaluate import check_all
from grpo.sampling.rounds import ERROR_CAUSES, Batch
from grpo.sampling.step_parts import Sampling
from grpo.system.distributed import World
from grpo.tasks import all_answered


@dataclass
class StepTimes:
    """Seconds since the step began at which each phase ended."""

    start: float
    scored: float  # the batch generated and scored
    updated: float  # the update done
    end: float  # the weights pushed to the engine, where there is one


def step_record(sampling: Sampling, step: int, batch: Batch, advantages: Tensor, stats: StepStats,
                times: StepTimes) -> dict[str, float]:
    """The metrics of one step, as metrics.jsonl has them."""
    generated = batch.generated_rewards()
    scored = generated[batch.generated_errors() == 0]  # the raw reward of the rows that did not error
    t_gen = sum(r.seconds_generate for r in batch.rounds)
    return {
        "reward_mean": scored.mean().item() if scored.numel() else float("nan"),
        "reward_std": scored.std().item() if scored.numel() > 1 else 0.0,
        **error_metrics(batch),
        **first_try_metrics(sampling, batch),
        **batch.reward_means(),
        **group_metrics(sampling, batch, advantages, t_gen),
        **screen_metrics(batch, t_gen),
        "accuracy": accuracy(sampling, batch.texts(), batch.group_rows(truncated=True), generated),
        "completion_len": batch.generated_lengths().float().mean().item(),
        "completion_len_max": batch.generated_lengths().max().item(),
        "truncated_frac": torch.cat([r.truncated for r in batch.rounds]).float().mean().item(),
        "repeat_ngram_frac": repeated_ngram_frac(batch.rollout.completion_ids, batch.rollout.mask),
        **step_episode_metrics(sampling, batch),
        **{k: v for k, v in vars(stats).items() if v is not None},  # None: not measured (no teacher)
        "lr": learning_rate(sampling.config, step),
        **({"temperature": sampling.generation.temperature.value} if sampling.config.temperature_target else {}),
        "time_generate": t_gen,
        "time_reward": times.scored - times.start - t_gen - screen_seconds(batch),
        "time_update": times.updated - times.scored,
        **({"time_sync": times.end - times.updated} if sampling.generation.engine is not None else {}),
        "time_step": times.end - times.start,
        "tokens_per_second": float(batch.generated_lengths().sum()) / (times.end - times.start),
    }


def error_metrics(batch: Batch) -> dict[str, float]:
    """Rows generated this step that errored (left out of the loss and their groups' statistics), as a
    share of them all and counted by cause (grpo/sampling/rounds.py, ERROR_CAUSES)."""
    errors = batch.generated_errors()  # (R*G,)
    out = {"errored_frac": (errors > 0).float().mean().item() if errors.numel() else 0.0}
    out.update({f"errored/{cause}": float((errors == 1 + k).sum()) for k, cause in enumerate(ERROR_CAUSES)})
    return out


def first_try_metrics(sampling: Sampling, batch: Batch) -> dict[str, float]:
    """The raw reward of groups that were the model's first try at their prompt (NaN when none were), and
    the share of groups whose prompt had been drawn before: see DrawCounts and the checker alarm."""
    g = sampling.config.group_size
    first = torch.tensor([f for r in batch.rounds for f in r.first_try], dtype=torch.bool)  # (R,)
    rewards = batch.generated_rewards().cpu().view(-1, g)  # (R, G)
    scored = rewards[first][batch.generated_errors().cpu().view(-1, g)[first] == 0]  # rows that did not error
    return {"reward_first_try": scored.mean().item() if scored.numel() else float("nan"),
            "repeat_frac": 1.0 - first.float().mean().item()}


def group_metrics(sampling: Sampling, batch: Batch, advantages: Tensor, seconds_generate: float
                  ) -> dict[str, float]:
    """Where the step's compute went: groups by outcome, and what the uninformative ones cost.

    Group fractions are over every group generated this step (what the
    sampler produced); ``trained_*`` and the advantages over the batch
    trained. Generation time is attributed to groups by their tokens.
    """
    cfg, g = sampling.config, sampling.config.group_size
    grouped = batch.generated_rewards().view(-1, g)  # (R, G) every generated group
    valid = (batch.generated_errors() == 0).view(-1, g)  # (R, G) rows that did not error
    estimator = cfg.advantage_estimator  # what "the group teaches" means follows it
    zero_var = ~group_varies(grouped, valid, estimator=estimator)  # (R,)
    top = torch.where(valid, grouped, float("-inf")).max(dim=1).values  # (R,) a constant group's one value
    tokens = batch.generated_lengths().view(-1, g).sum(dim=1).float()  # (R,)
    wasted = float(tokens[zero_var].sum() / tokens.sum().clamp(min=1))
    trained = batch.rewards.view(-1, g)  # (B', G)
    trained_zero_var = ~group_varies(trained, (batch.errors == 0).view(-1, g), estimator=estimator)  # (B',)
    trained_tokens = batch.lengths.view(-1, g).sum(dim=1).float()  # (B',)
    skipped = skipped_groups(cfg, advantages, len(trained))  # (B',)
    drawn = sum(len(r.prompts) for r in batch.rounds)
    out = {
        "zero_var_frac": zero_var.float().mean().item(),
        "all_correct_frac": (zero_var & (top >= 1.0)).float().mean().item(),
        "all_wrong_frac": (zero_var & valid.any(dim=1) & (top <= 0.0)).float().mean().item(),
        "mixed_frac": (~zero_var).float().mean().item(),
        "zero_var_tokens_frac": wasted,
        "time_generate_zero_var": seconds_generate * wasted,
        "tokens_generated": float(tokens.sum()),
        "tokens_zero_var": float(tokens[zero_var].sum()),
        **advantage_metrics(advantages),
        "trained_groups": len(trained),
        "trained_zero_var_frac": trained_zero_var.float().mean().item() if len(trained) else 0.0,
        "update_skipped_tokens_frac": float(trained_tokens[skipped].sum() / trained_tokens.sum().clamp(min=1)),
        "gen_rounds": len(batch.rounds),
        "generated_groups": drawn,
        # groups that varied beyond the first B, which the batch trains (grpo/sampling/rounds.py informative_batch): a
        # round sized for the share expected to vary can overshoot
        "surplus_groups": max(0, int((~zero_var).sum()) - cfg.prompts_per_step) if cfg.filter_groups else 0,
        "tokens_surplus": float(tokens[~zero_var][cfg.prompts_per_step:].sum()) if cfg.filter_groups else 0.0,
        "shortfall": cfg.prompts_per_step - len(trained),
        # the share of the B groups a step asks for that it trained with rewards that vary
        # (with a teacher every group trained has the teacher's signal)
        "signal_frac": float(len(trained) if cfg.teacher else (~trained_zero_var).sum()) / cfg.prompts_per_step,
    }
    if cfg.sampler != "uniform":
        out["sampler_explored_frac"] = sum(r.explored for r in batch.rounds) / drawn
    return out


def skipped_groups(cfg: TrainConfig, advantages: Tensor, groups: int) -> Tensor:
    """(B',) the trained groups that the update skips."""
    g = cfg.group_size
    # the update skips the groups whose advantages are all zero (grpo/learning/update.py trained_groups), which under
    # reinforce_pp_baseline are not its zero-variance groups: those get the batch's shift and train
    skip = cfg.skip_zero_advantage and cfg.beta == 0.0 and not cfg.teacher  # a teacher's term trains every group
    return (advantages.view(-1, g) == 0).all(dim=1).cpu() if skip else torch.zeros(groups, dtype=torch.bool)


def advantage_metrics(advantages: Tensor) -> dict[str, float]:
    """The step's advantages (N,): mean, std, and how many are not zero."""
    return {
        "adv_mean": advantages.mean().item() if advantages.numel() else 0.0,
        "adv_std": advantages.std().item() if advantages.numel() > 1 else 0.0,
        "adv_nonzero": int((advantages != 0).sum()),
        "adv_nonzero_frac": (advantages != 0).float().mean().item() if advantages.numel() else 0.0,
    }


def screen_seconds(batch: Batch) -> float:
    """The step's seconds of screening (prefill, or probe decoding): neither generation nor reward time."""
    return sum(r.screening.seconds for r in batch.rounds if r.screening is not None)


def screen_metrics(batch: Batch, seconds_generate: float) -> dict[str, float]:
    """What screening (grpo/sampling/screen.py) cost and how well it predicted, and the step's wasted share of
    generation time: the zero-variance groups' share of the decoding (by tokens) plus the prefill spent on
    candidates then skipped, over decoding and prefill together.

        generate_wasted_frac = (time_generate_zero_var + time_screen_skipped) / (time_generate + time_screen)

    Calibration: the mean predicted P(mixed) of the groups generated with a prediction
    (``screen_predicted_mixed``) against the share of them that varied (``screen_observed_mixed``)."""
    screened = [(r, r.screening) for r in batch.rounds if r.screening is not None]
    t_screen = sum(s.seconds for _, s in screened)
    skipped = sum(s.skipped_seconds for _, s in screened)
    grouped = batch.generated_rewards().view(-1, batch.rounds[0].rollout.group_size)  # (R, G)
    valid = (batch.generated_errors() == 0).view(grouped.shape)  # (R, G)
    zero_var = ~group_varies(grouped, valid, estimator=batch.rounds[0].estimator)  # (R,)
    tokens = batch.generated_lengths().view(grouped.shape).sum(dim=1).float()  # (R,)
    zero_var_share = float(tokens[zero_var].sum() / tokens.sum().clamp(min=1))
    # with no screening the share is the tokens' alone: no clock in it, so a resumed run repeats it exactly
    wasted = (zero_var_share if not screened else
              (seconds_generate * zero_var_share + skipped) / max(seconds_generate + t_screen, 1e-9))
    out = {"generate_wasted_frac": wasted,
           "time_screen": t_screen, "time_screen_skipped": skipped}
    predicted = torch.tensor([p for _, s in screened for p in s.predicted], dtype=torch.float64)
    observed = torch.cat([r.varies().cpu() for r, _ in screened]) if screened else torch.zeros(0, dtype=torch.bool)
    known = ~predicted.isnan()
    if bool(known.any()):
        out.update({"screen_predicted_mixed": predicted[known].mean().item(),
                    "screen_observed_mixed": observed[known].double().mean().item(),
                    "screen_groups": float(known.sum())})
    return out


def step_episode_metrics(sampling: Sampling, batch: Batch) -> dict[str, float]:
    """Turns, tool use, errors and environment time over every episode generated this step (summed
    over processes); nothing for a single-turn run."""
    if sampling.generation.agent is None:
        return {}
    episodes = [e for r in batch.rounds for e in r.rollout.episodes or []]
    own = episode_metrics(episodes)
    n = sum(len(r.rollout.texts) for r in batch.rounds)
    env_tokens = sum(e.env_tokens for e in episodes)
    tokens = env_tokens + sum(e.policy_tokens for e in episodes)
    means = ("turns_per_episode", "tool_calls_per_episode")
    keys = [k for k in own if k != "env_token_frac"]
    world = sampling.generation.world
    totals = world.sum(torch.tensor([own[k] * n if k in means else own[k] for k in keys]
                                    + [n, env_tokens, tokens], dtype=torch.float64)).tolist()
    count = max(totals[-3], 1.0)
    out = {k: v / count if k in means else v for k, v in zip(keys, totals[:-3], strict=True)}
    return {**out, "env_token_frac": totals[-2] / max(totals[-1], 1.0)}  # a ratio of the summed tokens


def best_completions(batch: Batch, group_size: int, k: int = 3) -> list[tuple[float, str]]:
    """This process's k highest-scoring distinct completions of the step, cut to 200 characters."""
    g, scored = group_size, []
    for r in batch.rounds:
        first = r.mine.start * g
        scored += zip(r.rewards[first : first + len(r.rollout.texts)].tolist(), r.rollout.texts, strict=True)
    best: dict[str, float] = {}
    for reward, text in sorted(scored, key=lambda pair: -pair[0]):
        best.setdefault(text[:200], reward)
        if len(best) == k:
            break
    return [(reward, text) for text, reward in best.items()]


def top_completions_note(top: list[tuple[float, str]]) -> str:
    """The latest step's highest-scoring completions (``best_completions``), for the checker-suspected alarm."""
    shown = "; ".join(f"{r:.2f} for {text!r}" for r, text in top)
    return f"; top-scoring completions: {shown}" if shown else ""


def accuracy(sampling: Sampling, texts: Sequence[str], rows: Sequence[Mapping], rewards: Tensor) -> float:
    """Share of completions the task's checker marks fully correct (reuses the reward when it is the checker)."""
    if sampling.scoring.reward_fns == [sampling.task.reward] and not sampling.config.reward_weights:
        return (rewards >= 1.0).float().mean().item()
    return sum(s >= 1.0 for s in check_all(sampling.scoring.checker, texts, rows)) / max(len(texts), 1)


def write_samples(step: int, batch: Batch, advantages: Tensor, *, group_size: int, world: World,
                  run_dir: Path | None) -> None:
    """Every trained completion of the step, with its reward, advantage, group, length and cut flag, to
    completions.jsonl (each process's, gathered by rank 0 in batch order)."""
    g = group_size
    first = world.split(batch.rewards.numel() // g).start * g  # this process's first row of the batch
    episodes = batch.rollout.episodes
    lines = [json.dumps({
        "step": step, "prompt": str(row["prompt"]), "answer": str(row.get("answer", "")), "completion": text,
        "reward": batch.rewards[first + i].item(), "advantage": advantages[first + i].item(),
        # the group's index in the step's batch, its tokens in the loss, and whether the token limit cut it
        "group": (first + i) // g, "length": int(batch.lengths[first + i]), "cut": bool(batch.truncated[first + i]),
        # the whole episode after the prompt, role-tagged
        **({} if episodes is None else {"transcript": episodes[i].transcript(), "turns": episodes[i].turns,
                                        "env_error": episodes[i].env_error}),
    }) for i, (row, text) in enumerate(zip([r for r in batch.rows for _ in range(g)], batch.rollout.texts,
                                            strict=True))]
    lines = [line for part in world.gather_objects(lines) for line in part]
    if run_dir is not None:
        with (run_dir / "completions.jsonl").open("a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)


def open_log(sampling: Sampling, run_dir: Path | None, state: RunState, *, progress: bool,
             explain: dict[str, Callable[[], str]], sources: Mapping[str, str] | None = None) -> RunLog:
    """config.json (each option's value, and under "sources" where it came from: grpo.config.SOURCES), the
    metrics sinks, the progress bar and the alarms (with a resumed run's history)."""
    cfg, logger = sampling.config, None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        written = {**cfg.to_dict(), "sources": dict(sources or {})}
        (run_dir / "config.json").write_text(json.dumps(written, indent=2) + "\n")
        logger = MetricsLogger(run_dir, wandb=cfg.wandb, config=cfg.to_dict())
    main = sampling.generation.world.is_main
    bar = StepProgress(cfg.steps, enabled=progress and main, silent=not main)
    alarms = AlarmConfig(window=state.alarm_window, no_signal_steps=cfg.no_signal_steps,
                         heldout_n=subset_size(sampling), train_n=train_sample_size(sampling), sampler=cfg.sampler,
                         full_n=len(sampling.heldout_prompts))
    monitor = AlarmMonitor(cfg.steps, alarms, watch_heldout=all_answered(sampling.task.heldout, sampling.task.reward),
                           watch_reward="none" not in cfg.rewards)  # --rewards none: no reward to rise
    monitor.load_state(state.alarms)  # a resumed run's alarms see the steps before it, and its notes said
    return RunLog(monitor, logger, bar, explain=explain, notes=dict(monitor.said))


@dataclass
class RunLog:
    """Where each step's metrics go: through the alarms (which add their flags), to the sinks."""

    monitor: AlarmMonitor
    logger: MetricsLogger | None
    bar: StepProgress
    explain: dict[str, Callable[[], str]] = field(default_factory=dict)  # alarm -> what to show with it
    raised: dict[str, int] = field(default_factory=dict)  # alarm -> first step it was on
    messages: dict[str, str] = field(default_factory=dict)  # alarm -> its first warning
    notes: dict[str, str] = field(default_factory=dict)  # note (grpo.observe.alarms.NOTES) -> what it said

    def record(self, step: int, metrics: dict[str, float], *, final: bool = False) -> None:
        """``final``: the run's last evaluation (its alarms' verdicts need no later one to confirm them)."""
        flags, warnings = self.monitor.observe(step, metrics, final=final)
        metrics.update(flags)
        for name, on in flags.items():
            if on:
                self.raised.setdefault(name.removeprefix("alarm/"), step)
        for name, text in warnings.items():
            text += self.explain[name]() if name in self.explain else ""
            (self.notes if name in NOTES else self.messages).setdefault(name, text)
            self.bar.warn(step, text, kind="note" if name in NOTES else "warning")
        if self.logger is not None:
            self.logger.log(step, metrics)

    def little_signal(self) -> str | None:
        """The run's end line when it trained on next to nothing and ``no_signal`` did not say so."""
        return little_signal(self.monitor.series.get("signal_frac", []), list(self.raised), self.monitor.config)

    def step(self, step: int, metrics: dict[str, float], *, steps: int, log_every: int) -> None:
        """A training step's record, its progress bar, and its console lines (every log_every steps, and
        when rows errored)."""
        self.record(step, metrics)
        self.bar.update(step, metrics)
        if log_every and step % log_every == 0:
            self.bar.print(summary_line(step, steps, metrics))
        if (said := errored_line(step, metrics)) is not None:
            self.bar.print(said)


class RunTotals:
    """The run's generation totals for summary.json, summed over its steps' records (saved with the
    checkpoints, so a resumed run counts its steps before the stop too; a checkpoint written before the
    totals existed resumes with them at zero)."""

    SUMMED = ("time_generate", "time_generate_zero_var", "time_screen", "time_screen_skipped", "tokens_generated",
              "tokens_zero_var", "generated_groups", "screen_groups", "surplus_groups", "tokens_surplus")

    def __init__(self) -> None:
        self.sums = dict.fromkeys(self.SUMMED, 0.0)
        self.sums.update(zero_var_groups=0.0, screen_predicted=0.0, screen_observed=0.0)

    def add(self, metrics: Mapping[str, float]) -> None:
        for key in self.SUMMED:
            self.sums[key] += float(metrics.get(key, 0.0))
        self.sums["zero_var_groups"] += metrics["zero_var_frac"] * metrics["generated_groups"]
        n = metrics.get("screen_groups", 0.0)
        self.sums["screen_predicted"] += metrics.get("screen_predicted_mixed", 0.0) * n
        self.sums["screen_observed"] += metrics.get("screen_observed_mixed", 0.0) * n

    def summary(self) -> dict[str, float]:
        """Seconds and tokens of generation and the shares wasted: on zero-variance groups, and (the
        seconds) on screening candidates then skipped; the screen's calibration over the run."""
        s = self.sums
        seconds = s["time_generate"] + s["time_screen"]
        wasted = s["time_generate_zero_var"] + s["time_screen_skipped"]
        out = {"seconds": round(seconds, 2), "seconds_wasted": round(wasted, 2),
               "wasted_frac": wasted / seconds if seconds else 0.0,
               "tokens": int(s["tokens_generated"]), "tokens_zero_var": int(s["tokens_zero_var"]),
               "zero_var_tokens_frac": s["tokens_zero_var"] / s["tokens_generated"] if s["tokens_generated"] else 0.0,
               "groups": int(s["generated_groups"]), "zero_var_groups": round(s["zero_var_groups"]),
               # groups that varied but were not trained (beyond B), and their share of the tokens
               "surplus_groups": round(s["surplus_groups"]),
               "surplus_tokens_frac": s["tokens_surplus"] / s["tokens_generated"] if s["tokens_generated"] else 0.0,
               "screen_seconds": round(s["time_screen"], 2), "screen_seconds_skipped": round(s["time_screen_skipped"], 2)}
        if s["screen_groups"]:
            out.update(screen_groups=int(s["screen_groups"]),
                       screen_predicted_mixed=s["screen_predicted"] / s["screen_groups"],
                       screen_observed_mixed=s["screen_observed"] / s["screen_groups"])
        return out

    def state_dict(self) -> dict:
        return dict(self.sums)

    def load_state_dict(self, state: dict) -> None:
        self.sums.update(state)
