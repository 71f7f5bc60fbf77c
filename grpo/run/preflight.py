"""The pre-flight check: can this model learn anything from this data and reward?

GRPO learns only from groups whose rewards differ. Before the first step the
starting model samples a group for each of a few dozen training prompts,
the rewards score them, and the check reports what a run would meet: the
pass rate, the share of groups that vary, how many completions hit the
token limit, their lengths, reward errors and timeouts, with one example
per outcome; under a teacher, the student's divergence to it (what a first step logs as teacher_kl),
the signal itself with no reward. Problems are said in plain words with what to try:

- no group varies (the model solves none, or all, or the reward is constant):
  no step can update the policy; ``preflight="on"`` stops here;
- few groups vary: most generation is wasted; dynamic sampling pays for it;
- most completions hit the token limit: their answers are cut and score 0;
- a reward raised or timed out, or is constant while others vary.

``strict`` stops on any of them, ``warn`` on none. For a user's data with no
token limit given, the check samples at 256 tokens and fits the limit to
the lengths the model writes (1.5 times the 95th percentile of completions
that ended on their own, or of the correct ones' median when that is lower;
with few correct, to what a correct answer needs: the gold answer's place in
the completions that contain it, or the gold answers' lengths; never so low
that it cuts more than a tenth of the correct completions),
so a run on short answers does not pay for 256;
its sampling stops at that limit once 95% of the completions have ended,
so the check does not pay for 256 either.
The check draws with its own random generator: the run that follows samples
exactly as it would without it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from grpo.math.algorithm import group_varies
from grpo.run.memory_check import memory_line, trainer_prediction
from grpo.run.preflight_samples import _sample_round, _Samples
from grpo.run.token_limit import correct_floor, fit_token_limit, mean_tokens
from grpo.sampling.rounds import reordered_rounds
from grpo.sampling.step_parts import Learner, Sampling

if TYPE_CHECKING:
    from grpo.config import TrainConfig
from grpo.learning.update import teacher_divergence, update_seconds
from grpo.sampling.vllm_engine import VLLMEngine

FEW_VARY = 0.25  # below this share of varying groups, most of each step's generation teaches nothing
MOSTLY_CUT = 0.5  # above this share of completions at the limit, the limit is too low


@dataclass(frozen=True)
class Problem:
    """Something that will hurt the run; ``fatal`` problems mean no step can learn."""

    kind: str
    message: str
    fatal: bool = False


@dataclass
class PreflightReport:
    prompts: int
    group_size: int
    max_new_tokens: int
    pass_rate: float  # share of completions the task's checker marks fully correct
    reward_mean: float
    varying_frac: float  # groups whose rewards are not all equal
    all_correct_frac: float
    all_wrong_frac: float
    truncated_frac: float
    lengths: dict[str, float]  # p50, p95, max completion tokens
    reward_errors: dict[str, float]
    reward_timeouts: dict[str, float]
    examples: dict[str, str]  # outcome -> one completion
    seconds: float
    fitted_max_new_tokens: int | None = None
    step_seconds: float | None = None  # generation time a training step can expect, from the check's pace
    prompt_format: str = ""  # the run's, settled (grpo/sampling/prompts.py)
    stop: tuple[str, ...] = ()  # the stop strings sampling used, the format's included
    update_seconds: float | None = None  # a step's update, from one forward and backward of the check's samples
    steps_fit: int | None = None  # steps that fit in --minutes at step_seconds + update_seconds, after adapting
    steps_before: int | None = None  # ... and before
    adapted: list[str] = field(default_factory=list)  # what the step budget changed, one line each
    answer_limit: int | None = None  # the token limit a correct answer needs (fit_token_limit, none correct)
    sample_lengths: list[int] = field(default_factory=list)  # the check's completion lengths (tokens)
    memory: dict | None = None  # the predicted peak, what is free, its terms (grpo/run/memory.py)
    memory_line: str = ""  # ... said in a line
    problems: list[Problem] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # a data source's splits as read, the overlap removed (grpo/tasks/data.py)
    teacher_kl: float | None = None  # under --teacher: what a first step would log as teacher_kl, on these samples
    rewarded: bool = True  # False under --rewards none: the teacher's divergence is the whole signal

    def stops(self, mode: str) -> list[Problem]:
        """The problems that end the run under ``mode`` (on: fatal ones; strict: all; warn, off: none)."""
        if mode == "strict":
            return list(self.problems)
        return [p for p in self.problems if p.fatal] if mode == "on" else []

    def describe(self) -> str:
        n = self.prompts * self.group_size
        lines = [
            f"pre-flight: {self.prompts} prompts x {self.group_size} samples at <= {self.max_new_tokens} tokens "
            f"in {self.seconds:.0f} s",
            f"  {self._signal(n)}; hit the token limit {self.truncated_frac:.0%}; length p50 "
            f"{self.lengths['p50']:.0f}, p95 {self.lengths['p95']:.0f}, max {self.lengths['max']:.0f} tokens",
        ]
        if self.prompt_format:
            lines.insert(1, f"  prompt format {self.prompt_format}; {describe_stops(self.stop)}")
        errors = {k: v for k, v in self.reward_errors.items() if v}
        if errors:
            lines.append("  reward errors: " + ", ".join(f"{k} {v:.0f}" for k, v in errors.items()))
        for outcome, text in self.examples.items():
            lines.append(f"  example ({outcome}): {_short(text)}")
        if self.fitted_max_new_tokens is not None:
            lines.append(f"  token limit fitted to the data: max_new_tokens = {self.fitted_max_new_tokens}")
        if self.step_seconds is not None:
            lines.append(f"  expected generation time: about {self.step_seconds:.0f} s a step at this pace")
        if self.update_seconds is not None:
            lines.append(f"  expected update time: about {self.update_seconds:.0f} s a step")
        if self.memory_line:
            lines.append(f"  {self.memory_line}")
        for p in self.problems:
            lines.append(f"  {'PROBLEM' if p.fatal else 'warning'} ({p.kind}): {p.message}")
        return "\n".join(lines)

    def _signal(self, n: int) -> str:
        """What a step learns from: the pass rate and the groups that vary; under a teacher its divergence
        too, and alone with no reward (the task's checker still reads the samples, but trains nothing)."""
        taught = "" if self.teacher_kl is None else f"divergence to the teacher {self.teacher_kl:.4f} nats a token"
        if not self.rewarded:
            return f"{taught or 'no samples'}, the signal (no reward; the task's checker passed {self.pass_rate:.1%})"
        rates = (f"pass rate {self.pass_rate:.1%} of {n}; groups that vary {self.varying_frac:.0%} "
                 f"(all correct {self.all_correct_frac:.0%}, all wrong {self.all_wrong_frac:.0%})")
        return rates + (f"; {taught}" if taught else "")

    def budget(self, minutes: float) -> list[str]:
        """The step budget's console lines: seconds a step, the steps that fit, what it changed."""
        if self.steps_fit is None:
            return []
        total = (self.step_seconds or 0.0) + (self.update_seconds or 0.0)
        after = [f"step budget: {self.steps_fit} steps fit after these changes"] if self.adapted else []
        return [f"step budget: about {total:.0f} s a step ({self.step_seconds:.0f} s generation, "
                f"{self.update_seconds:.0f} s update): {self.steps_before} steps fit in {minutes:g} minutes",
                *self.adapted, *after]

    def to_dict(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k not in ("problems", "memory_line")}
        out["problems"] = [vars(p) for p in self.problems]
        return out


def describe_stops(stop: tuple[str, ...]) -> str:
    """'stop strings '\\n', 'Question:'' as Python writes them (a newline shows as \\n)."""
    return f"stop strings {', '.join(repr(x) for x in stop)}" if stop else "no stop strings (end-of-turn tokens only)"


def _short(text: str, width: int = 160) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[: width - 3] + "...")


def draw_prompts(n_train: int, count: int, seed: int) -> list[int]:
    """Which training prompts the check samples: a fixed-seed draw, the same on every process."""
    return random.Random(seed).sample(range(n_train), min(count, n_train))


def find_problems(report: PreflightReport, reward_names: Sequence[str], constant: Sequence[str], *,
                  tuned_limit: bool = False) -> list[Problem]:
    """What is wrong, in plain words, with what to try. ``tuned_limit``: the token limit is the task's own
    tuned setting, whose cuts are meant to teach short answers, so they are not a problem."""
    problems = []
    n = report.prompts * report.group_size
    broken = [name for name in reward_names if report.reward_errors.get(name, 0) >= n]
    if broken:  # every row errored: no verdict to learn from, whatever else the check saw
        problems.append(Problem("reward errors", (
            f"reward {', '.join(broken)} failed on every one of the {n} completions (the warning above shows "
            "its first error), so no completion has a reward and GRPO has nothing to learn from. Fix the "
            "reward, or raise --reward-timeout if the calls timed out. (--preflight warn runs anyway.)"),
            fatal=True))
    elif report.varying_frac == 0.0:
        problems.append(_no_signal(report, n))
    elif report.varying_frac < FEW_VARY:
        problems.append(Problem("few groups vary", (
            f"only {report.varying_frac:.0%} of groups had rewards that differ (pass rate {report.pass_rate:.1%}); "
            "every other group teaches nothing, so each step generates extra rounds to find informative ones "
            "(filter_groups) and learning will be slow. Try a stronger model, easier prompts, a larger "
            "group_size, or a reward with partial credit.")))
    if report.truncated_frac > MOSTLY_CUT and not tuned_limit:
        problems.append(Problem("truncation", (
            f"{report.truncated_frac:.0%} of completions hit the {report.max_new_tokens}-token limit; a cut "
            "completion has no final answer and scores 0. Raise --max-new-tokens, or ask for shorter answers "
            "in --system-prompt or --prompt-template.")))
    for name in reward_names:
        if name not in broken and (report.reward_errors.get(name) or report.reward_timeouts.get(name)):
            problems.append(Problem("reward errors", (
                f"reward {name} failed on {report.reward_errors.get(name, 0):.0f} of {n} completions "
                f"({report.reward_timeouts.get(name, 0):.0f} timeouts); a failed row is left out of training. Fix the reward, or "
                "raise --reward-timeout.")))
    if len(reward_names) > 1:
        for name in (name for name in constant if name not in broken):  # a broken one is named above
            problems.append(Problem("constant reward", (
                f"reward {name} gave every completion the same value; it adds nothing to any advantage. "
                "Check that it reads the fields your data has.")))
    return problems


def _no_signal(report: PreflightReport, n: int) -> Problem:
    if report.all_wrong_frac == 1.0 and report.pass_rate == 0.0:
        what = f"the model solved none of the {n} samples"
        advice = ("Try a stronger --model, easier data, a --system-prompt or --prompt-template that asks for "
                  "the answer in the form the reward reads")
        if report.truncated_frac > MOSTLY_CUT:
            advice += f", a larger --max-new-tokens ({report.truncated_frac:.0%} of completions were cut)"
        advice += ", or a reward that gives partial credit."
    elif report.all_correct_frac == 1.0:
        what, advice = f"the model solved all {n} samples", "Use harder data: there is nothing left to learn."
    else:
        what = f"every group's rewards were equal (reward {report.reward_mean:.3g} throughout)"
        advice = "Check the reward: it does not tell completions apart on this data."
    return Problem("no signal", (
        f"{what}, so every group's rewards are equal and GRPO has nothing to learn from: no step would update "
        f"the policy. {advice} (--preflight warn runs anyway.)"), fatal=True)


def _percentiles(lengths: Sequence[int]) -> dict[str, float]:
    ordered = sorted(lengths) or [0]
    pick = lambda q: float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "max": float(ordered[-1])}


def _examples(texts: Sequence[str], correct: Sequence[bool], truncated: Sequence[bool]) -> dict[str, str]:
    """One completion per outcome: correct, wrong (complete), cut by the token limit."""
    out: dict[str, str] = {}
    for text, ok, cut in zip(texts, correct, truncated, strict=True):
        outcome = "cut by the token limit" if cut else ("correct" if ok else "wrong")
        out.setdefault(outcome, text)
    return out


def _announce(sampling: Sampling) -> None:
    """What the check is about to do (rank 0 prints; the vLLM engine says its own start and its seconds)."""
    cfg = sampling.config
    if not sampling.generation.world.is_main:
        return
    more = (f" (up to {cfg.max_gen_rounds} rounds of new prompts while no group varies)"
            if cfg.max_gen_rounds > 1 else "")
    print(f"pre-flight: sampling {cfg.group_size} completions for each of {cfg.preflight_prompts} training prompts"
          f"{more} at <= {cfg.max_new_tokens} tokens; prompt format {cfg.prompt_format}, {describe_stops(cfg.stop)} "
          "(--no-preflight skips this)", flush=True)


def _summary(samples: _Samples, grouped: torch.Tensor, valid: torch.Tensor, cfg: TrainConfig, names: list[str]
             ) -> PreflightReport:
    """What the samples show: the pass rate, the groups that vary (as training counts them: over the rows
    that did not error), the lengths, the reward errors; the rest of the report is filled in after."""
    same = ~group_varies(grouped, valid, estimator=cfg.advantage_estimator)  # (B,)
    top = torch.where(valid, grouped, float("-inf")).max(dim=1).values  # (B,) a constant group's one value
    total = lambda key: sum(m[key] for m in samples.metrics)  # noqa: E731
    return PreflightReport(
        prompts=len(grouped), group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
        pass_rate=sum(samples.correct) / max(len(samples.correct), 1), reward_mean=grouped.mean().item(),
        varying_frac=(~same).float().mean().item(),
        all_correct_frac=(same & (top >= 1.0)).float().mean().item(),
        all_wrong_frac=(same & valid.any(dim=1) & (top <= 0.0)).float().mean().item(),
        truncated_frac=sum(samples.truncated) / max(len(samples.truncated), 1),
        lengths=_percentiles(samples.lengths),
        reward_errors={k: total(f"reward_errors/{k}") for k in names},
        reward_timeouts={k: total(f"reward_timeouts/{k}") for k in names},
        examples=_examples(samples.texts, samples.correct, samples.truncated), seconds=0.0,
        prompt_format=cfg.prompt_format, stop=tuple(cfg.stop), rewarded="none" not in cfg.rewards,
    )


def _step_costs(report: PreflightReport, samples: _Samples, sampling: Sampling, learner: Learner) -> None:
    """What a training step can expect to cost, in the report: its generation seconds and its update's, at the
    fitted token limit where there is one."""
    cfg = sampling.config
    report.step_seconds = expected_step_seconds(report, cfg.prompts_per_step, cfg.max_gen_rounds,
                                                dynamic=cfg.filter_groups and not cfg.teacher)  # a teacher: one round
    if report.fitted_max_new_tokens is not None and samples.lengths:
        # a batch decodes as many steps as its longest row: at the fitted limit, that many at most
        report.step_seconds *= min(1.0, report.fitted_max_new_tokens / max(samples.lengths))
    if samples.last is not None and samples.last.completion_ids.numel():
        # an update's cost follows its completion tokens: at the fitted limit the ramblings are cut short
        limit = report.fitted_max_new_tokens or cfg.max_new_tokens
        per_row = mean_tokens(samples.lengths, limit)
        engine = sampling.generation.engine
        report.update_seconds = update_seconds(learner, samples.last, engine) * cfg.completions_per_step * per_row
        report.sample_lengths = list(samples.lengths)


def run_preflight(sampling: Sampling, learner: Learner, *, fit: bool, tuned_limit: bool = False
                  ) -> PreflightReport:
    """Sample the starting model on training prompts and report; see the module doc.

    A round samples ``preflight_prompts`` prompts. While no group has varied, further rounds of new
    prompts follow, up to ``max_gen_rounds`` in all (what one training step may generate), so that a
    pass rate of a few percent is not mistaken for none. Every process runs the same draws with the
    same generator, so under torchrun all reach the same verdict. ``fit``: fit a token limit;
    ``tuned_limit``: the task's own limit is in use (a problem of its own when most completions hit it).
    """
    start_engine(sampling.generation.engine)  # before the clock: vLLM's start-up is not generation
    cfg, start, g = sampling.config, time.perf_counter(), sampling.config.group_size
    _announce(sampling)
    order = draw_prompts(len(sampling.task.train), cfg.preflight_prompts * cfg.max_gen_rounds, cfg.seed)
    generator = torch.Generator(device=sampling.generation.device).manual_seed(cfg.seed + 7919)
    samples = _Samples()
    with reordered_rounds(sampling.generation):
        for first in range(0, len(order), cfg.preflight_prompts):  # the rounds share one reordering
            _sample_round(sampling, order[first : first + cfg.preflight_prompts], generator, samples, fit=fit)
            grouped, valid = samples.grouped(g)
            if cfg.teacher or group_varies(grouped, valid, estimator=cfg.advantage_estimator).any():
                break
    names = sampling.scoring.score.names
    report = _summary(samples, grouped, valid, cfg, names)
    if fit:
        report.fitted_max_new_tokens = fit_token_limit(samples.lengths, samples.truncated, samples.correct,
                                                       cfg.max_new_tokens, reach=samples.reach,
                                                       answer_lengths=samples.answer_lengths)
    constant = [k for k in names if all(m.get(f"reward/{k}_std", 1.0) == 0.0 for m in samples.metrics)]
    report.problems = find_problems(report, names, constant, tuned_limit=tuned_limit)
    if cfg.teacher:  # every group has the teacher's signal, whatever its rewards
        report.problems = [p for p in report.problems if p.kind not in ("no signal", "few groups vary")]
    report.seconds = time.perf_counter() - start
    _step_costs(report, samples, sampling, learner)
    if cfg.teacher and samples.last is not None:  # a teacher stops after one round: samples.last is all
        report.teacher_kl = teacher_divergence(learner, samples.last)
    prediction, available = trainer_prediction(sampling, samples.lengths, samples.truncated)
    if prediction is not None:
        report.memory, report.memory_line = prediction.to_dict(available), memory_line(prediction, available)
        report.memory["prompt_tokens"] = max((len(p) for p in sampling.train_prompts), default=0)
    answer = fit_token_limit(samples.lengths, samples.truncated, [False] * len(samples.lengths),
                             cfg.max_new_tokens, reach=samples.reach, answer_lengths=samples.answer_lengths)
    keep = correct_floor(samples.lengths, samples.truncated, samples.correct, cfg.max_new_tokens)
    report.answer_limit = answer if answer is None or keep is None else max(answer, keep)
    return report


def start_engine(engine: VLLMEngine | None) -> float | None:
    """Start the vLLM engine, if there is one not yet started (the first rollout would); its seconds."""
    if engine is None or engine.conn is not None:
        return None
    start = time.perf_counter()
    engine.start()
    return time.perf_counter() - start


def expected_step_seconds(report: PreflightReport, prompts_per_step: int, max_rounds: int, *,
                          dynamic: bool) -> float:
    """Generation seconds a training step can expect: a round of B prompts at the check's pace per prompt,
    times the rounds dynamic sampling needs to find B varying groups at the check's share (at most
    max_rounds). run_preflight scales it down to a fitted token limit."""
    per_prompt = report.seconds / max(report.prompts, 1)
    needed = 1 if not dynamic else min(max_rounds, math.ceil(1 / report.varying_frac)) if report.varying_frac else max_rounds
    return per_prompt * prompts_per_step * needed


def preflight_summary(report: PreflightReport | None) -> Mapping[str, object] | None:
    """What summary.json keeps of the check."""
    if report is None:
        return None
    taught = {} if report.teacher_kl is None else {"teacher_kl": report.teacher_kl}
    return {"pass_rate": report.pass_rate, "varying_frac": report.varying_frac, **taught,
            "truncated_frac": report.truncated_frac, "problems": [p.kind for p in report.problems]}
