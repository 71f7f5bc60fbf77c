"""Held-out evaluation: greedy pass@1, and pass@k and maj@k from n samples, under the task's checker.

A completion is correct when the checker gives it the full reward (1.0).
pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large
Language Models Trained on Code", https://arxiv.org/abs/2107.03374): with c of
n samples correct, the chance that k drawn without replacement hold at least
one correct one, 1 - C(n-c, k) / C(n, k). maj@k is the chance that the most
common answer among k samples is correct; it is averaged over the n // k
disjoint blocks of k samples, and an answer is the completion with
whitespace collapsed and one trailing period dropped (ties go to the answer
seen first).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from grpo.rewards.combine import RewardScorer
from grpo.sampling.episode_scores import episode_total
from grpo.sampling.episodes import Agent, Episode
from grpo.sampling.packed_linear import packed_linears
from grpo.sampling.prompts import encode_prompts as encode_prompts  # the one renderer; imported from here too
from grpo.sampling.rollout import generate

RewardFn = Callable[[str, Mapping], float]


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), as the product prod_{i=n-c+1}^{n} (1 - k/i) (no huge binomials)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def answer_key(completion: str) -> str:
    """What maj@k votes on: the completion with whitespace collapsed and one trailing period dropped."""
    text = " ".join(completion.split())
    return text[:-1].rstrip() if text.endswith(".") else text


def majority_at_k(answers: Sequence[str], correct: Sequence[bool], k: int) -> float:
    """Share of the n // k disjoint blocks of k samples whose most common answer is correct."""
    if not 0 < k <= len(answers):
        raise ValueError(f"majority_at_k needs 0 < k <= n = {len(answers)}, got k={k}")
    is_correct = {}
    for a, ok in zip(answers, correct, strict=True):
        is_correct[a] = is_correct.get(a, False) or ok
    blocks = len(answers) // k
    wins = 0
    for b in range(blocks):
        voted, _ = Counter(answers[b * k : (b + 1) * k]).most_common(1)[0]
        wins += is_correct[voted]
    return wins / blocks


@dataclass(frozen=True)
class EvalResult:
    """Held-out scores: greedy pass@1, and pass@k / maj@k from ``samples`` samples per prompt."""

    accuracy: float  # greedy pass@1
    size: int
    samples: int = 0
    pass_at: dict[int, float] = field(default_factory=dict)
    maj_at: dict[int, float] = field(default_factory=dict)
    solved: tuple[bool, ...] = ()  # greedy pass@1 per prompt, in the order given (this process's prompts)

    def metrics(self) -> dict[str, float]:
        """The metric keys logged to metrics.jsonl: heldout_accuracy, heldout_pass@k, heldout_maj@k."""
        out = {"heldout_accuracy": self.accuracy}
        out.update({f"heldout_pass@{k}": v for k, v in self.pass_at.items()})
        out.update({f"heldout_maj@{k}": v for k, v in self.maj_at.items()})
        return out

    def describe(self) -> str:
        parts = [f"greedy pass@1 {self.accuracy:.1%}"]
        parts += [f"pass@{k} {v:.1%}" for k, v in self.pass_at.items()]
        parts += [f"maj@{k} {v:.1%}" for k, v in self.maj_at.items()]
        extra = f", {self.samples} samples each" if self.samples else ""
        return f"{', '.join(parts)} (of {self.size} prompts{extra})"


@torch.no_grad()
def completions(
    model: nn.Module,
    tokenizer: object,
    prompts: list[list[int]],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float,
    batch_size: int,
    generator: torch.Generator | None = None,
    streams: Tensor | None = None,
    on_batch: Callable[[int], None] | None = None,
    stop_strings: tuple[str, ...] = (),
    agent: Agent | None = None,
    rows: Sequence[Mapping] = (),
    token_budget: int = 0,
) -> tuple[list[str], list[bool], list[Episode | None]]:
    """``samples`` completions per prompt (grouped by prompt), whether each hit the token limit, and each
    one's episode record (None for a single-turn task); temperature 0 is greedy. With an ``agent`` each
    completion is an episode opened from its row (``rows``), and its text is the last policy turn.
    ``streams`` (len(prompts) * samples, 2): each completion's random stream (grpo/sampling/random_streams.py), else
    they draw from ``generator``. ``token_budget`` (0: none): each prefill's tokens a model call."""
    was_training = model.training
    model.eval()
    texts: list[str] = []
    truncated: list[bool] = []
    episodes: list[Episode | None] = []
    per_batch = max(1, batch_size // samples)
    for i in range(0, len(prompts), per_batch):
        batch = prompts[i : i + per_batch]
        part = None if streams is None else streams[i * samples : (i + len(batch)) * samples]
        if agent is None:
            rollout = generate(
                model, tokenizer, batch, group_size=samples, max_new_tokens=max_new_tokens,
                temperature=temperature, generator=generator, stop_strings=stop_strings, streams=part,
                token_budget=token_budget,
            )
        else:
            rollout = agent.run(
                model, tokenizer, rows[i : i + per_batch], group_size=samples, max_new_tokens=max_new_tokens,
                temperature=temperature, generator=generator, stop_strings=stop_strings, streams=part,
                token_budget=token_budget,
            )
        texts.extend(rollout.texts)
        truncated.extend(rollout.truncated.tolist())
        episodes.extend(rollout.episodes or [None] * len(rollout.texts))
        if on_batch is not None:
            on_batch(len(batch))
    model.train(was_training)
    return texts, truncated, episodes


def scored_rows(rows: Sequence[Mapping], truncated: Sequence[bool], samples: int = 1) -> list[Mapping]:
    """Each completion's row, marked ``truncated`` when it hit the token limit (a cut answer scores 0)."""
    return [{**rows[i // samples], "truncated": cut} for i, cut in enumerate(truncated)]


def check_all(reward: RewardFn | RewardScorer, texts: Sequence[str], rows: Sequence[Mapping]) -> list[float]:
    """The checker's score of each completion. A scorer (:class:`grpo.rewards.combine.RewardScorer`, as
    training, evaluation and pre-flight use) runs it in worker processes with the run's time limit, so a
    checker that hangs on one completion scores it 0 instead of hanging the evaluation; a plain function
    is called here, one completion at a time."""
    if isinstance(reward, RewardScorer):
        return reward.checker_scores(texts, rows)
    return [float(reward(t, r)) for t, r in zip(texts, rows, strict=True)]


def greedy_accuracy(
    model: nn.Module,
    tokenizer: object,
    prompts: list[list[int]],
    rows: Sequence[Mapping],
    reward: RewardFn,
    *,
    max_new_tokens: int,
    batch_size: int = 128,
    on_batch: Callable[[int], None] | None = None,
    stop_strings: tuple[str, ...] = (),
    agent: Agent | None = None,
    token_budget: int = 0,
) -> tuple[float, list[str], list[bool]]:
    """Fraction of prompts whose greedy completion earns the checker's full reward (1.0); the completions;
    which prompts earned it. An episode's reward adds the environment's to the checker's."""
    texts, truncated, extra = completions(model, tokenizer, prompts, samples=1, max_new_tokens=max_new_tokens,
                                          temperature=0.0, batch_size=batch_size, on_batch=on_batch,
                                          stop_strings=stop_strings, agent=agent, rows=rows,
                                          token_budget=token_budget)
    if not texts:
        return 0.0, texts, []
    marked = scored_rows(rows, truncated)
    scores = check_all(reward, texts, marked)
    solved = [episode_total(s, e) >= 1.0 for s, e in zip(scores, extra, strict=True)]
    return sum(solved) / len(texts), texts, solved


def evaluate(
    model: nn.Module,
    tokenizer: object,
    prompts: list[list[int]],
    rows: Sequence[Mapping],
    reward: RewardFn,
    *,
    max_new_tokens: int,
    batch_size: int = 128,
    samples: int = 0,
    ks: Sequence[int] = (),
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    streams: Tensor | None = None,
    on_batch: Callable[[int], None] | None = None,
    stop_strings: tuple[str, ...] = (),
    agent: Agent | None = None,
    token_budget: int = 0,
) -> EvalResult:
    """Greedy pass@1; with samples = n > 0 also pass@k and maj@k for each k in ks (k <= n), sampled
    with ``generator`` or, one per completion, ``streams`` (len(prompts) * n, 2). ``token_budget`` (0:
    none): each prefill's tokens a model call (a run's micro_batch_tokens)."""
    bad = [k for k in ks if not 0 < k <= samples] if samples else []
    if bad:
        raise ValueError(f"each k must be in 1..samples ({samples}), got {bad[0]}")
    with packed_linears(model, lazy=True):  # every batch's turns on one reordering (grpo/sampling/packed_linear.py)
        acc, _, solved = greedy_accuracy(model, tokenizer, prompts, rows, reward, max_new_tokens=max_new_tokens,
                                         batch_size=batch_size, on_batch=on_batch, stop_strings=stop_strings,
                                         agent=agent, token_budget=token_budget)
        if not samples or not prompts:
            return EvalResult(acc, len(prompts), solved=tuple(solved))
        texts, truncated, extra = completions(
            model, tokenizer, prompts, samples=samples, max_new_tokens=max_new_tokens, temperature=temperature,
            batch_size=batch_size, generator=generator, streams=streams, on_batch=on_batch,
            stop_strings=stop_strings, agent=agent, rows=rows, token_budget=token_budget)
    marked = scored_rows(rows, truncated, samples)
    scores = check_all(reward, texts, marked)
    pass_sums = dict.fromkeys(ks, 0.0)
    maj_sums = dict.fromkeys(ks, 0.0)
    for p in range(len(rows)):
        group = texts[p * samples : (p + 1) * samples]
        block = slice(p * samples, (p + 1) * samples)
        correct = [episode_total(s, e) >= 1.0 for s, e in zip(scores[block], extra[block], strict=True)]
        answers = [answer_key(t) for t in group]
        for k in ks:
            pass_sums[k] += pass_at_k(samples, sum(correct), k)
            maj_sums[k] += majority_at_k(answers, correct, k)
    n = len(prompts)
    return EvalResult(acc, n, samples, {k: v / n for k, v in pass_sums.items()},
                      {k: v / n for k, v in maj_sums.items()}, tuple(solved))
