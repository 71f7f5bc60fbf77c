"""Screening: spend generation on the prompts whose group is likely to vary.

A group whose G rewards are all equal teaches nothing (grpo/math/algorithm.py,
``group_varies``); dynamic sampling throws it away after paying for its G
completions. With ``screen = K`` each round draws K candidates per group it
needs from the prompt sampler, runs one prefill over the candidates' prompts
(no completion token), reads the policy's last hidden state h at each
prompt's end, and predicts the prompt's pass rate

    p_hat = sigmoid(beta_0 + beta . (h - mu) / sigma),

a fractional logistic regression (Papke & Wooldridge 1996) on every group
generated so far: target the group's pass fraction (rewards clipped to
[0, 1], errored rows left out), weight its valid rows, decayed by half every
DATA_HALF_LIFE steps because the policy moves. The chance the prompt's
group of G varies is then

    P(mixed) = 1 - p_hat^G - (1 - p_hat)^G.

Of the K n candidates the round generates n: a share ``screen_explore`` drawn
uniformly from all candidates whatever their prediction (exploration: a prompt
the predictor would skip is still drawn now and then, so a wrong prediction is
found out and the policy keeps seeing every kind of prompt), the rest the
highest P(mixed). A prompt is rarely seen twice on a large task (``add``:
7,844 prompts over 20 steps), so per-prompt history (the frontier sampler)
cannot say this; the hidden state generalises across prompts, and the
prefill that computes it is a small share of a group's cost (one pass over
the prompt against G completions decoded token by token).

With ``screen_by = probe`` the features are instead one completion sampled
and scored per candidate (grpo/sampling/rounds.py, probe_features: its probability,
its least likely token's, its reward), the target whether each group varied,
and the ranking that probability of varying itself; the probe is thrown
away, so a group generated after it is G new draws (docs/screening.md).

Until MIN_GROUPS groups with both outcomes seen have been observed the round
is drawn as without screening (the features of its prompts still computed, to
fit on). The prefill's seconds count as generation; its share spent on
candidates then skipped (by prompt tokens) counts as wasted, like a
zero-variance group's. Deviation from GRESO (arXiv 2506.02177), which skips
by a prompt's own reward history: here the predictor is shared by all prompts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

from grpo.sampling.forward import encode_prompt_batch

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from grpo.sampling.prompt_samplers import FrontierSampler, UniformSampler
    from grpo.system.distributed import ModelCalls, World

MIN_GROUPS = 16  # groups observed before the predictor ranks candidates
DATA_HALF_LIFE = 5.0  # steps after which an observed group's weight in the fit halves
MAX_ROWS = 4096  # groups kept for the fit, the newest
RIDGES = (1.0, 10.0, 100.0)  # ridge strengths tried at each fit, the best on a held-back quarter kept
CHUNK = 64  # prompts per prefill


def mixed_chance(p: np.ndarray, g: int) -> np.ndarray:
    """P(a group of g Bernoulli(p) rewards is not all equal) = 1 - p^g - (1 - p)^g."""
    p = np.clip(p, 0.0, 1.0)
    return 1.0 - p**g - (1.0 - p) ** g


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, ridge: float, iters: int = 10) -> np.ndarray:
    """beta (1 + H,) minimising the weighted fractional logistic loss with a ridge on the slopes:

        sum_i w_i [-y_i log s_i - (1 - y_i) log(1 - s_i)] + ridge / 2 |beta_1:|^2,  s_i = sigmoid(beta . [1, x_i]),

    by Newton's method (x (n, H), y (n,) in [0, 1], w (n,) >= 0). The intercept starts at the
    weighted mean's logit, so with no slope signal the fit predicts the mean.
    """
    design = np.hstack([np.ones((len(x), 1)), x])  # (n, 1 + H)
    mean = float(np.clip((w * y).sum() / max(w.sum(), 1e-12), 1e-4, 1 - 1e-4))
    beta = np.zeros(design.shape[1])
    beta[0] = math.log(mean / (1 - mean))
    penalty = np.full(design.shape[1], ridge)
    penalty[0] = 1e-6  # the intercept is not shrunk
    for _ in range(iters):
        s = sigmoid(design @ beta)  # (n,)
        grad = design.T @ (w * (s - y)) + penalty * beta
        hess = (design.T * (w * s * (1 - s))) @ design + np.diag(penalty)
        beta -= np.linalg.solve(hess, grad)
    return beta


def log_loss(beta: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    s = np.clip(sigmoid(beta[0] + x @ beta[1:]), 1e-6, 1 - 1e-6)
    return float((w * -(y * np.log(s) + (1 - y) * np.log(1 - s))).sum() / max(w.sum(), 1e-12))


def choose(mixed: np.ndarray, n: int, explore: float, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Which n of the candidates (positions into ``mixed``, their P(mixed)) a round generates: the
    exploration picks (n * explore in expectation, uniform over all candidates) and the rest, the
    highest P(mixed) among the candidates not explored. Returns (exploited, explored)."""
    n = min(n, len(mixed))
    whole, frac = divmod(n * explore, 1.0)
    n_explore = min(n, int(whole) + int(rng.random() < frac))
    explored = [int(i) for i in rng.choice(len(mixed), size=n_explore, replace=False)] if n_explore else []
    rest = np.setdiff1d(np.arange(len(mixed)), explored)
    ranked = rest[np.argsort(-mixed[rest], kind="stable")]
    return [int(i) for i in ranked[: n - n_explore]], explored


class PassRatePredictor:
    """p_hat from the prompt-end hidden state, fitted online; see the module docstring."""

    def __init__(self, seed: int) -> None:
        self.x = np.zeros((0, 0), dtype=np.float32)  # (n, H) the observed groups' prompt features
        self.y = np.zeros(0)  # (n,) their pass fractions
        self.w = np.zeros(0)  # (n,) their valid rows
        self.steps = np.zeros(0, dtype=np.int64)  # (n,) the step each was generated at
        self.rng = np.random.default_rng(seed)
        self.beta: np.ndarray | None = None  # the fit, on standardised features; None: stale
        self.scale = (np.zeros(0), np.ones(0))  # mu, sigma of the features at the fit

    def observe(self, step: int, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        keep = w > 0
        x, y, w = x[keep], y[keep], w[keep]
        if not len(y):
            return
        self.x = x.astype(np.float32) if not len(self.y) else np.vstack([self.x, x.astype(np.float32)])[-MAX_ROWS:]
        self.y = np.concatenate([self.y, y])[-MAX_ROWS:]
        self.w = np.concatenate([self.w, w])[-MAX_ROWS:]
        self.steps = np.concatenate([self.steps, np.full(len(y), step)])[-MAX_ROWS:]
        self.beta = None

    def ready(self) -> bool:
        """Enough groups, with both passes and failures among them, to rank candidates."""
        return len(self.y) >= MIN_GROUPS and 0.0 < float((self.w * self.y).sum()) < float(self.w.sum())

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(n,) p_hat for features x (n, H)."""
        if self.beta is None:
            self._fit()
        mu, sigma = self.scale
        return sigmoid(self.beta[0] + ((x - mu) / sigma) @ self.beta[1:])

    def _fit(self) -> None:
        """The ridge with the lowest log-loss on a held-back quarter of the groups, then refitted on all."""
        mu, sigma = self.x.mean(axis=0), self.x.std(axis=0) + 1e-6
        x = (self.x - mu) / sigma
        w = self.w * 0.5 ** ((self.steps.max() - self.steps) / DATA_HALF_LIFE)
        held = self.rng.random(len(x)) < 0.25
        best = min(RIDGES, key=lambda r: log_loss(fit_logistic(x[~held], self.y[~held], w[~held], r),
                                                  x[held], self.y[held], w[held]) if held.any() else r)
        self.beta, self.scale = fit_logistic(x, self.y, w, best), (mu, sigma)

    def state_dict(self) -> dict:
        return {"x": self.x.copy(), "y": self.y.copy(), "w": self.w.copy(), "steps": self.steps.copy(),
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.x, self.y, self.w = np.array(state["x"]), np.array(state["y"]), np.array(state["w"])
        self.steps, self.beta = np.array(state["steps"]), None
        self.rng.bit_generator.state = state["rng"]


@dataclass
class Screening:
    """What screening did for one round: the prefill's cost and the predictions of the groups generated."""

    screened: int  # candidates prefilled (state) or probed (probe)
    seconds: float  # the prefill's, or the probes' decoding
    skipped_seconds: float  # its share spent on the candidates skipped (by prompt tokens, or probe tokens)
    predicted: list[float]  # (n,) P(mixed) of each generated group, NaN before the predictor is ready


class Prefill(Protocol):
    """What the screen's prefill reads of the generation record (grpo/sampling/step_parts.py, Generation): the
    policy to prefill the prompts on, and the processes it agrees with."""

    world: World
    tokenizer: object
    model: torch.nn.Module
    policy: ModelCalls
    autocast: AbstractContextManager


class Drawn(Protocol):
    """What the screen reads of the drawing record (Drawing): the prompt sampler it draws candidates from."""

    sampler: UniformSampler | FrontierSampler


class Screened(Protocol):
    """What the screen reads of the sampling side (Sampling): the prompts, and the two records above."""

    train_prompts: list[list[int]]
    generation: Prefill
    drawing: Drawn


def prompt_states(sampling: Screened, prompts: Sequence[int]) -> np.ndarray:
    """(n, H) the policy's last hidden state at the end of each training prompt (one prefill, no grad)."""
    gen, ids = sampling.generation, [sampling.train_prompts[i] for i in prompts]
    pad = gen.tokenizer.pad_token_id
    gen.model.eval()
    with gen.autocast, gen.policy.gathered() as model:
        states = torch.cat([encode_prompt_batch(model.get_decoder(), ids[k : k + CHUNK], 1, pad).last_hidden.float()
                            for k in range(0, len(ids), CHUNK)])  # (n, H)
    return states.cpu().numpy()


def prompt_features(sampling: Screened, prompts: Sequence[int]) -> tuple[np.ndarray, float, np.ndarray]:
    """The ``state`` screen's features: (C, H) prompt-end hidden states, the prefill's seconds, and each
    prompt's tokens (C,), by which the prefill's seconds are apportioned."""
    start = time.perf_counter()
    features = prompt_states(sampling, prompts)
    tokens = np.array([len(sampling.train_prompts[c]) for c in prompts], dtype=np.float64)
    return features, time.perf_counter() - start, tokens


Featurize = Callable[[list[int]], tuple[np.ndarray, float, np.ndarray]]


class Screen:
    """Draws each round's prompts through the screen; learns from the groups' rewards."""

    def __init__(self, group_size: int, candidates: int, explore: float, seed: int, by: str = "state") -> None:
        self.group_size, self.candidates, self.explore, self.by = group_size, candidates, explore, by
        self.predictor = PassRatePredictor(seed + 104729)
        self.rng = np.random.default_rng(seed + 1299709)
        self.pending: dict[int, np.ndarray] = {}  # prompt -> its features, until its group is observed

    def draw(self, sampling: Screened, n: int, step: int, exclude: Collection[int], avoid: Collection[int],
             featurize: Featurize | None = None) -> tuple[list[int], Screening]:
        """The round's n prompts, drawn from the prompt sampler through the screen. ``featurize``: the
        candidates' features, their seconds and each one's cost (its share of those seconds); None: the
        prompt-end hidden states (``screen_by = state``), each candidate's cost its prompt tokens."""
        sampler = sampling.drawing.sampler
        ready = self.predictor.ready()
        candidates = sampler.draw(n * self.candidates if ready else n, step, exclude=exclude, avoid=avoid)
        features, seconds, cost = (featurize or (lambda c: prompt_features(sampling, c)))(candidates)  # (C, F)
        if not ready:
            self.pending.update(zip(candidates, features, strict=True))
            return candidates, Screening(len(candidates), seconds, 0.0, [math.nan] * len(candidates))
        mixed = self.predictor.predict(features)  # (C,)
        if self.by == "state":  # the predicted pass rate: the chance a group of G independent draws is mixed
            mixed = mixed_chance(mixed, self.group_size)
        exploited, explored = choose(mixed, n, self.explore, self.rng)
        tail = len(candidates) - getattr(sampler, "explored", 0)  # the sampler's own uniform draws end its list
        # the frontier sampler measures the pool on its uniform draws, last in the list: those of them the
        # screen took uniformly stay there; the others are no longer a uniform sample of the pool
        last = [i for i in explored if i >= tail]
        picked = exploited + [i for i in explored if i < tail] + last
        if hasattr(sampler, "explored"):
            sampler.explored = len(last)
        picked = sampling.generation.world.broadcast_object(picked)  # one choice for all processes
        prompts = [candidates[i] for i in picked]
        self.pending.update((candidates[i], features[i]) for i in picked)
        skipped = 1.0 - cost[picked].sum() / max(cost.sum(), 1e-12)
        return prompts, Screening(len(candidates), seconds, seconds * skipped, [float(mixed[i]) for i in picked])

    def observe(self, step: int, prompts: Sequence[int], rewards: Tensor, valid: Tensor, varies: Tensor) -> None:
        """The groups' rewards (n, G), valid rows (n, G) and whether each taught (n,) for the prompts last
        drawn: the target is each group's pass fraction (``state``) or whether it varied (``probe``)."""
        w = valid.float().sum(dim=1).cpu().numpy()  # (n,)
        y = (rewards.float().clamp(0.0, 1.0) * valid).sum(dim=1).cpu().numpy() / np.maximum(w, 1.0)  # (n,)
        if self.by == "probe":  # one observation per group, whatever its valid rows (none: no evidence)
            y, w = varies.float().cpu().numpy(), np.minimum(w, 1.0)
        x = np.stack([self.pending[i] if i in self.pending else self._missing(i) for i in prompts])
        self.predictor.observe(step, x, y, w)
        self.pending.clear()

    def _missing(self, prompt: int) -> np.ndarray:
        raise KeyError(f"screen: prompt {prompt} was observed but never drawn through the screen")

    def state_dict(self) -> dict:
        return {"predictor": self.predictor.state_dict(), "rng": self.rng.bit_generator.state, "by": self.by}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("by", "state")  # a checkpoint from before screen_by screened by the state
        if saved != self.by:
            raise ValueError(f"the checkpoint's screen read {saved!r} features; this run's screen_by is {self.by!r}")
        self.predictor.load_state_dict(state["predictor"])
        self.rng.bit_generator.state = state["rng"]


def make_screen(config: object) -> Screen | None:
    """The config's screen; None when screening is off (screen below 2)."""
    if config.screen < 2:
        return None
    return Screen(config.group_size, config.screen, config.screen_explore, config.seed, config.screen_by)
