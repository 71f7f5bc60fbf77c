"""Which prompts next: ``uniform`` (the default for a user's --data file) or ``frontier`` (for the built-in tasks).

A group whose G rewards are all equal has zero advantages: it costs a full
rollout and teaches nothing. ``frontier`` spends the batch where the model's
competence is moving. For each prompt it keeps a Beta posterior over the
prompt's pass rate p from every group the prompt has had,

    p_i ~ Beta(k * m + s_i, k * (1 - m) + f_i)

(s_i, f_i: rewards and their complements summed over the prompt's completions,
rewards clipped to [0, 1]; m: the pool's mean reward as exploration measures
it), and the chance that the prompt's next group of G is mixed, the quantity a
group is worth something for:

    P(mixed) = 1 - E[p^G] - E[(1 - p)^G],   E[p^G] = prod_{j<G} (a + j) / (a + b + j).

The prior's strength k is fitted to the pool (empirical Bayes): if pass rates
are Beta(k m, k (1 - m)), a uniform draw's group pass fraction x has variance
V = m (1 - m) (1 + k / G) / (k + 1), so k = (m (1 - m) - V) / (V - m (1 - m) / G),
with m and V measured on the exploration draws. On tasks where most prompts
are always or never solved (V near m (1 - m)) k is small, and one all-wrong
group is enough to rank a prompt below a uniform draw; with pass rates spread
evenly, k is larger and one group says less. ``prior_strength`` fixes k instead.

Each draw of n prompts:

- ``explore_frac`` of them (in expectation) are uniform over the whole pool:
  unseen prompts, and prompts once solved or unsolvable, are revisited at a
  set rate, because the model's competence moves;
- the rest are exploitation: among seen prompts whose P(mixed) beats that of
  a uniform draw (the mixed rate measured on the exploration draws), the
  highest by Thompson sampling (draw p from the posterior, score
  1 - p^G - (1 - p)^G), so the pick varies between steps instead of training
  the same few prompts; slots without such a prompt are explored too.

Old evidence decays: counts are multiplied by 0.5 every ``half_life`` steps,
so a prompt solved long ago drifts back to the prior and is tried again.
Evidence from before an update that trained on the prompt is dropped: a mixed
group is trained on, and the update moves that prompt's pass rate on purpose,
so the group describes a policy that no longer exists. Without this a prompt
once half-solved stays "likely mixed" through many all-correct groups after the
policy has learned it, and the sampler keeps paying for solved prompts (on a
user's division file: 70% of the generated groups all correct, 85% repeats).

Samplers are deterministic functions of their seed and of the rewards they
observe; every process under torchrun holds the same sampler, feeds it the
whole batch's gathered rewards and so draws the same prompts. A sampler with
``state_dict``/``load_state_dict`` is saved with the checkpoints
(grpo/run/checkpoint.py captures the trainer's ``sampler`` attribute).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Protocol

import numpy as np
from torch import Tensor

from grpo.math.algorithm import group_varies

SAMPLERS = ("uniform", "frontier")


class PromptSampler(Protocol):
    """Chooses the next prompt indices and learns from the rewards their groups got."""

    def draw(self, n: int, step: int, exclude: Collection[int] = (), *, avoid: Collection[int] = ()) -> list[int]:
        """n indices into the training prompts, for training step ``step``: none of ``exclude`` where the
        sampler can help it (earlier rounds of the step), none of ``avoid`` while any other prompt is left
        (the prompts of batches sampled ahead and not yet trained on: grpo/run/async_batches.py)."""
        ...

    def observe(self, step: int, prompts: Sequence[int], rewards: Tensor, valid: Tensor | None = None) -> None:
        """The rewards (len(prompts), G) that the drawn prompts' groups got; ``valid`` (same shape, bool)
        False where a row errored (its reward is no verdict: not counted)."""
        ...


class UniformSampler:
    """Independent uniform draws, with replacement, from the trainer's ``prompt_rng``.

    The draws are exactly those of a trainer without samplers (the same
    ``randrange`` calls). It has no state of its own: ``prompt_rng`` is saved
    with the trainer.
    """

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size, self.rng = size, rng

    def draw(self, n: int, step: int, exclude: Collection[int] = (), *, avoid: Collection[int] = ()) -> list[int]:
        if not avoid or len(set(avoid)) >= self.size:
            return [self.rng.randrange(self.size) for _ in range(n)]
        out: list[int] = []
        while len(out) < n:  # a draw that lands on a prompt in flight is drawn again
            i = self.rng.randrange(self.size)
            if i not in avoid:
                out.append(i)
        return out

    def observe(self, step: int, prompts: Sequence[int], rewards: Tensor, valid: Tensor | None = None) -> None:
        pass

    def state_dict(self) -> dict:
        return {}  # its draws are prompt_rng's, saved apart

    def load_state_dict(self, state: dict) -> None:
        pass


def expected_power(a: np.ndarray, b: np.ndarray, g: int) -> np.ndarray:
    """E[p^g] for p ~ Beta(a, b): prod_{j<g} (a + j) / (a + b + j)."""
    out = np.ones_like(a, dtype=np.float64)
    for j in range(g):
        out *= (a + j) / (a + b + j)
    return out


def mixed_probability(a: np.ndarray, b: np.ndarray, g: int) -> np.ndarray:
    """P(a group of g Bernoulli(p) rewards is not all equal), p ~ Beta(a, b)."""
    return 1.0 - expected_power(a, b, g) - expected_power(b, a, g)


class FrontierSampler:
    """Prompts near the competence frontier, with exploration; see the module docstring."""

    def __init__(
        self,
        size: int,
        group_size: int,
        *,
        seed: int,
        explore_frac: float = 0.25,
        half_life: float = 20.0,
        prior_strength: float | None = None,
        estimator: str = "grpo",
    ) -> None:
        self.size, self.group_size = size, group_size
        self.estimator = estimator  # which groups teach (group_varies), as dynamic sampling sees them
        self.explore_frac, self.half_life, self.prior_strength = explore_frac, half_life, prior_strength
        self.rng = np.random.default_rng(seed)
        self.successes = np.zeros(size)  # s_i, decayed to step seen_at[i]
        self.failures = np.zeros(size)  # f_i
        self.seen_at = np.full(size, -1, dtype=np.int64)  # the step of the latest evidence; -1: never
        self.trained = np.zeros(size, dtype=bool)  # whether the latest group was mixed, so trained on
        # the exploration draws' measurements, decayed like the counts: [sum, count]
        self.pool_reward = np.array([0.5, 1.0])  # mean reward m (a prior of one half-correct group)
        self.pool_mixed = np.array([0.5, 1.0])  # mixed rate of a uniform draw
        self.pool_groups = np.zeros(3)  # explored groups: [count, sum of x, sum of x^2], x their pass fraction
        self.now = 0  # the latest step observed
        self.explored = 0  # how many of the last draw were exploration

    # ---- the posterior ----

    def _decay(self, step: int) -> np.ndarray:
        age = np.where(self.seen_at >= 0, step - self.seen_at, 0)
        return 0.5 ** (age / self.half_life)

    def posterior(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Beta(a, b) of every prompt's pass rate at ``step``."""
        m = float(np.clip(self.pool_reward[0] / self.pool_reward[1], 0.01, 0.99))  # keeps a, b > 0
        k = self.strength()
        decay = self._decay(step)
        return k * m + decay * self.successes, k * (1 - m) + decay * self.failures

    def strength(self, fallback: float = 2.0, least: float = 0.1, most: float = 100.0) -> float:
        """The prior's k: fixed, or fitted to the explored groups' spread (``fallback`` until 4 are seen)."""
        if self.prior_strength is not None:
            return self.prior_strength
        count, total, squares = self.pool_groups
        if count < 4:
            return fallback
        m = total / count
        spread, var = m * (1 - m), max(squares / count - m * m, 0.0)
        if spread <= 0.0:
            return fallback  # every explored group all right or all wrong alike: nothing to fit yet
        if var <= spread / self.group_size:  # no more spread than binomial noise: one shared pass rate
            return most
        return float(np.clip((spread - var) / (var - spread / self.group_size), least, most))

    def baseline(self) -> float:
        """P(mixed) of a uniform draw, as measured on the exploration draws."""
        return float(self.pool_mixed[0] / self.pool_mixed[1])

    # ---- drawing ----

    def draw(self, n: int, step: int, exclude: Collection[int] = (), *, avoid: Collection[int] = ()) -> list[int]:
        if avoid and len(set(exclude) | set(avoid)) < self.size:
            exclude = set(exclude) | set(avoid)
        whole, frac = divmod(n * self.explore_frac, 1.0)
        n_explore = int(whole) + int(self.rng.random() < frac)  # n * explore_frac in expectation
        chosen = self._exploit(n - n_explore, step, set(exclude))
        self.explored = n - len(chosen)
        return chosen + self._uniform(self.explored, set(exclude) | set(chosen))

    def _exploit(self, n: int, step: int, exclude: set[int]) -> list[int]:
        """Up to n seen prompts more likely than a uniform draw to give a mixed group, by Thompson score."""
        if n <= 0:
            return []
        a, b = self.posterior(step)
        seen = self.seen_at >= 0
        seen[list(exclude)] = False
        candidates = np.flatnonzero(seen & (mixed_probability(a, b, self.group_size) > self.baseline()))
        if len(candidates) == 0:
            return []
        p = self.rng.beta(a[candidates], b[candidates])
        score = 1.0 - p**self.group_size - (1.0 - p) ** self.group_size
        best = candidates[np.argsort(-score, kind="stable")[:n]]
        return [int(i) for i in best]

    def _uniform(self, n: int, exclude: set[int]) -> list[int]:
        """n distinct uniform draws avoiding ``exclude`` (repeats only once the pool is used up)."""
        out: list[int] = []
        taken = set(exclude)
        for _ in range(n):
            if len(taken) >= self.size:
                taken = set()
            while (i := int(self.rng.integers(self.size))) in taken:
                pass
            taken.add(i)
            out.append(i)
        return out

    # ---- learning ----

    def observe(self, step: int, prompts: Sequence[int], rewards: Tensor, valid: Tensor | None = None) -> None:
        """Add each group's rewards (len(prompts), G) to its prompt's counts, leaving out rows not ``valid``
        (errored); the last ``explored`` prompts of the latest draw were exploration and also measure the pool."""
        varies = group_varies(rewards.detach(), valid, estimator=self.estimator).cpu().numpy()  # (B,) as dynamic sampling sees them
        r = rewards.detach().double().clamp(0.0, 1.0).cpu().numpy()  # (B, G) as pass rates
        v = np.ones_like(r) if valid is None else valid.detach().cpu().numpy().astype(np.float64)  # (B, G)
        idx = np.asarray(prompts, dtype=np.int64)
        self._age_pool(step)
        for i, row, kept, mixed in zip(idx, r, v, varies, strict=True):  # one at a time: a prompt may repeat
            if self.trained[i] and self.seen_at[i] < step:
                keep = 0.0  # the counts predate an update on this prompt (within a step, none has come)
            else:
                keep = 0.5 ** ((step - self.seen_at[i]) / self.half_life) if self.seen_at[i] >= 0 else 1.0
            self.successes[i] = keep * self.successes[i] + (row * kept).sum()
            self.failures[i] = keep * self.failures[i] + ((1.0 - row) * kept).sum()
            self.seen_at[i] = step
            self.trained[i] = bool(mixed)
        n_explored = self.explored or 0
        explored, kept = r[len(r) - n_explored :], v[len(v) - n_explored :]  # (E, G)
        self.pool_reward += [(explored * kept).sum(), kept.sum()]
        self.pool_mixed += [float(varies[len(r) - len(explored) :].sum()), len(explored)]
        scored = kept.sum(axis=1) > 0  # (E,) groups with any row that did not error
        x = (explored * kept).sum(axis=1)[scored] / kept.sum(axis=1)[scored]
        self.pool_groups += [len(x), x.sum(), (x * x).sum()]

    def _age_pool(self, step: int) -> None:
        keep = 0.5 ** (max(step - self.now, 0) / self.half_life)
        self.pool_reward *= keep
        self.pool_mixed *= keep
        self.pool_groups *= keep
        self.now = max(self.now, step)

    # ---- checkpoints ----

    def state_dict(self) -> dict:
        return {
            "rng": self.rng.bit_generator.state, "successes": self.successes.copy(),
            "failures": self.failures.copy(), "seen_at": self.seen_at.copy(), "trained": self.trained.copy(),
            "pool_reward": self.pool_reward.copy(), "pool_mixed": self.pool_mixed.copy(),
            "pool_groups": self.pool_groups.copy(), "now": self.now, "explored": self.explored,
        }

    def load_state_dict(self, state: dict) -> None:
        if len(state["successes"]) != self.size:
            raise ValueError(f"sampler state holds {len(state['successes'])} prompts, the task has {self.size}")
        self.rng.bit_generator.state = state["rng"]
        for name in ("successes", "failures", "seen_at", "pool_reward", "pool_mixed"):
            setattr(self, name, np.array(state[name]))
        self.pool_groups = np.array(state.get("pool_groups", np.zeros(3)))  # absent from older checkpoints
        self.trained = np.array(state.get("trained", np.zeros(self.size, dtype=bool)), dtype=bool)
        self.now, self.explored = int(state["now"]), int(state["explored"])


SHARE_DECAY = 0.5  # the weight of the steps before in DrawCounts.varied_share: one step's 32 groups are a noisy count


class DrawCounts:
    """How many times each training prompt has been drawn, so that a step can tell the groups that are the
    model's first try at their prompt from those it has trained on before. Their rewards differ when the
    policy memorises the training prompts a sampler keeps returning: the reward on first tries follows
    held-out accuracy, the reward on repeats runs ahead of it."""

    def __init__(self, size: int) -> None:
        self.counts = np.zeros(size, dtype=np.int64)
        # the share of generated groups that varied, averaged over the steps with weights halving a step back
        # (SHARE_DECAY): it sizes a step's first round (grpo/sampling/rounds.py); None before any step
        self.varied_share: float | None = None

    def observe_share(self, share: float) -> None:
        """A step's share of generated groups that varied, into the running average."""
        old = self.varied_share
        self.varied_share = share if old is None else SHARE_DECAY * old + (1 - SHARE_DECAY) * share

    def first_tries(self, prompts: Sequence[int]) -> list[bool]:
        """Which of ``prompts`` were never drawn before; then counts them as drawn."""
        first = [bool(self.counts[i] == 0) for i in prompts]
        np.add.at(self.counts, np.asarray(prompts, dtype=np.int64), 1)
        return first

    def state_dict(self) -> dict:
        return {"counts": self.counts.tolist(), "varied_share": self.varied_share}

    def load_state_dict(self, state: dict) -> None:
        self.counts = np.array(state["counts"], dtype=np.int64)
        self.varied_share = state.get("varied_share")  # absent before round_prompts: as at the start


def make_sampler(name: str, size: int, group_size: int, *, rng: random.Random, seed: int,
                 explore_frac: float, half_life: float, estimator: str = "grpo") -> UniformSampler | FrontierSampler:
    """The config's sampler over ``size`` training prompts."""
    if name == "uniform":
        return UniformSampler(size, rng)
    if name == "frontier":
        return FrontierSampler(size, group_size, seed=seed, explore_frac=explore_frac, half_life=half_life,
                               estimator=estimator)
    raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")
