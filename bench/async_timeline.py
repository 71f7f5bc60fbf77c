"""Asynchronous GRPO with a fixed lag K (``--async-lag K``): seconds per step in steady state, simulated.

Batch t is sampled with the weights after update t-1-K (the initial weights while t-1-K <= 0). One sampler
(an inference engine) generates the batches one after another; one trainer updates on them in order. For
steps s, t = 1, 2, ...:

    sampler job s starts when job s-1 is done and update s-1-K is done (no wait while s-1-K <= 0); it
        first loads those weights (the push: P seconds on the sampler, which samples nothing meanwhile;
        none while it still uses the initial weights), then samples batch s for G_s seconds;
    update t starts when batch t is sampled and update t-1 is done, and lasts U_t seconds (the copy of
        the weights that the trainer hands to the push is part of U_t: it blocks the trainer no longer).

K = 0 is the synchronous loop: push, generate, update, strictly alternating, P + G + U a step. With constant
times the step is max(P + G, U, (P + G + U) / (K + 1)) (the slowest of the sampler's own loop, the
trainer's own loop, and the loop gen s -> update s -> gen s+1+K that spans K + 1 steps), which for every
K >= 1 is max(P + G, U): the slower side alone. A lag beyond 1 pays only when the times vary from step to
step, where it lets a fast batch make up for a slow one. G and U vary here as lognormals with a given mean
and coefficient of variation (CV), drawn once per seed and shared by every K, so the K columns differ by
the schedule alone.

Two devices. The simulation assumes the sampler and the trainer run on separate hardware (separate GPUs,
or separate CPU cores), so neither phase slows the other. On one shared device the phases take turns
whatever K is, and a lag buys staleness and no speed. Splitting one pool of devices into a sampler's share
and a trainer's share makes each phase slower than it is on the whole pool: give the times each phase
takes on its own share. Not modelled: a push that is only transfer latency with both sides busy
(prime-rl's default lag of 2 is there to hide such a broadcast over the Internet), in-flight weight updates
and partial rollouts (PipelineRL, AReaL, verl's fully async recipe), streaming batches, and any slow-down
of a phase when the other runs beside it on shared host memory, PCIe or CPU.

The presets (``--preset``), each with its source in ``PRESETS``; none is our own measurement:

    verl-1off-fsdp2, verl-1off-megatron   verl's one-step-off recipe, Qwen2.5-Math-7B DAPO, 16 H20 GPUs
                                          split 4 generate / 12 train: phase seconds measured split
    verl-dapo32b-share                    the same document: rollout about 70% of a DAPO 32B step (a
                                          ratio only; a colocated run, so units of one synchronous step)
    vime-npu-qwen3-4b                     a vime issue: Qwen3-4B GRPO, 2 + 2 Ascend NPUs (not GPUs),
                                          synchronous on split devices: the K = 0 this script models
    cpu-this-machine                      our own times, given on the command line

Read and left without a preset, for they give a speed-up and no phase times: AReaL (arXiv 2505.24298:
up to 2.77x over synchronous training on the same GPUs); PipelineRL (arXiv 2509.19128: about 2x on 128
H100s); prime-rl (https://docs.primeintellect.ai/prime-rl/async.md: with K = 1 and equal step times
neither side idles); verl's fully async recipe (2.35x-2.67x on 128 GPUs, with streaming and partial
rollout: https://github.com/volcengine/verl/blob/2147009822388b70cda46ab4a27c5400d3d113ed/docs/advance/fully_async.md).
That recipe's colocated synchronous rows do give phase seconds on the whole pool, Qwen2.5-Math-7B: step
790.10 s = gen 357.41 + old_log_prob 107.71 + update_actor 313.81 (+ the rest) on 32 H20s; 365.28 =
150.72 + 70.26 + 133.41 on 64; 356.30 = 177.85 + 53.92 + 113.81 on 128 (table "Asynchronous Training
on 7B Model"): generation 41-50% of a step.

    .venv/bin/python bench/async_timeline.py --check
    .venv/bin/python bench/async_timeline.py [--preset NAME|all] [--gen-cv 0.3] [--update-cv 0.1]
    .venv/bin/python bench/async_timeline.py --preset cpu-this-machine --gen-s 40 --update-s 25 --push-s 2

Prints, per scenario, its inputs and their source, what the source itself reported, and for K = 0..3:
seconds per step in steady state, the speed-up over K = 0, the share of wall time the trainer waits for a
batch, and the share the sampler waits for weights (the push is neither: it is sampler work).
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """Mean phase times of one GRPO step, and where they come from."""

    name: str
    gen_s: float
    """G: time the sampler takes to generate one batch (mean)."""
    update_s: float
    """U: time the trainer is busy per step (mean): log-probs, loss, backward, optimiser, the rest."""
    push_s: float
    """P: time the sampler spends loading new weights before the batch that needs them."""
    source: str
    """Where G, U and P come from: a URL and the table, row and columns, or 'user input'."""
    reported: str = ""
    """What the source itself measured for the schedules it ran, to compare with the table printed."""
    unit: str = "s"
    """The unit of G, U and P: seconds, or 'sync steps' where the source gives only shares of a step."""

    def __post_init__(self) -> None:
        for field, value in (("gen_s", self.gen_s), ("update_s", self.update_s)):
            if not value > 0:
                raise ValueError(f"{field} must be > 0, got {value}")
        if not self.push_s >= 0:
            raise ValueError(f"push_s must be >= 0, got {self.push_s}")


VERL_ONE_STEP_OFF = "https://github.com/volcengine/verl/blob/e55d143181568d5232e4c2c6ba0d3a2ea1f7ebcd/docs/advance/one_step_off.md"

PRESETS: dict[str, Scenario] = {
    # Table "Experimental Results", row "one-step-overlap async | VLLM+FSDP2": Qwen2.5-Math-7B, DAPO, vLLM,
    # max response 20,480 tokens, 16 H20 GPUs of which 4 generate and 12 train. The doc's own formula is
    # step ~ wait_prev_gen + old_log_prob + update_actor; step - wait_prev_gen is the trainer's busy time.
    "verl-1off-fsdp2": Scenario(
        name="verl-1off-fsdp2",
        gen_s=458.0,
        update_s=520.0 - 45.0,
        push_s=0.3,
        source=(
            f"{VERL_ONE_STEP_OFF} (verl 'Recipe: One Step Off Policy Async Trainer', last updated 07/17/2025), "
            "table 'Experimental Results', row 'one-step-overlap async, VLLM+FSDP2'. G = generate_sequences "
            "458 s; U = step 520 - wait_prev_gen 45 = 475 s (old_log_prob 108 + update_actor 337 + 30 s "
            "of other trainer work); P = 0.3 s, the doc's bound 'At most of time, the latency is under 300ms' "
            "(NCCL). Times measured with the GPUs split 4 generate / 12 train."
        ),
        reported=(
            "one-step-off (K = 1) on the split GPUs: step 520 s, of it wait_prev_gen 45 s. Colocated "
            "synchronous on all 16 GPUs (not this script's K = 0): step 749 s = gen 321 + old_log_prob 88 "
            "+ update_actor 286 (+ rest); whole run 19h18m -> 15h34m (+23%)."
        ),
    ),
    # Same table, row "one-step-overlap async | VLLM+Megatron"; max response 8,192 tokens.
    "verl-1off-megatron": Scenario(
        name="verl-1off-megatron",
        gen_s=501.0,
        update_s=566.0 - 59.0,
        push_s=0.3,
        source=(
            f"{VERL_ONE_STEP_OFF}, table 'Experimental Results', row 'one-step-overlap async, VLLM+Megatron'. "
            "G = generate_sequences 501 s; U = step 566 - wait_prev_gen 59 = 507 s (old_log_prob 120 + "
            "update_actor 347 + 40 s of other trainer work); P = 0.3 s (the doc's 'under 300ms'). GPUs split "
            "4 generate / 12 train."
        ),
        reported=(
            "one-step-off (K = 1) on the split GPUs: step 566 s, of it wait_prev_gen 59 s. Colocated "
            "synchronous on all 16 GPUs: step 699 s = gen 207 + old_log_prob 119 + update_actor 344 "
            "(+ rest); whole run 18h21m -> 13h06m (+40%)."
        ),
    ),
    # Section "Background" of the same document: a share, measured colocated (every GPU does both phases).
    "verl-dapo32b-share": Scenario(
        name="verl-dapo32b-share",
        gen_s=0.70,
        update_s=0.30,
        push_s=0.0,
        unit="sync steps",
        source=(
            f"{VERL_ONE_STEP_OFF}, section 'Background': 'in DAPO 32B training, the Rollout phase accounts "
            "for approximately 70% of the total time' (a ratio only; its figure links wandb). G = 0.70 and "
            "U = 0.30 of one colocated synchronous step (the 30% is all that is not rollout); P not given, "
            "0 here. Colocated shares: splitting the GPUs would slow both phases."
        ),
        reported="no asynchronous run of this model in that document.",
    ),
    # Comment of 2026-07-24, "Setup 2": Qwen3-4B, GRPO, dapo-math-17k, Ascend A3 NPUs, 2 actor + 2 rollout
    # devices (disaggregated, in both modes), rollout batch 32 x 8 samples, max response 2k tokens.
    "vime-npu-qwen3-4b": Scenario(
        name="vime-npu-qwen3-4b",
        gen_s=97.2,
        update_s=81.4,
        push_s=0.0,
        source=(
            "https://github.com/vllm-project/vime/issues/358 (comment of 2026-07-24, 'Setup 2'; Ascend A3 "
            "NPUs, not GPUs), table 'Core Performance Metrics', column 'Sync (200 steps)'. G = avg train_wait "
            "97.2 s (the trainer's wait for the rollout in the synchronous loop); U = avg train_time 81.4 s; "
            "P not reported apart, 0 here. Synchronous on split devices, as this script's K = 0."
        ),
        reported=(
            "synchronous: step 178.3 s (train_wait 97.2 s, 54.6%). vime's fully async (no fixed lag): step "
            "104.0 s (1.72x), train_wait 4.6 s, train_time 99.6 s (the update got slower beside the rollout)."
        ),
    ),
}

OWN_PRESET = "cpu-this-machine"
"""Our own times: G, U and P come from --gen-s, --update-s, --push-s (measured with bench/ tools)."""


def lognormal_times(mean: float, cv: float, n: int, rng: random.Random) -> list[float]:
    """n draws with the given mean and coefficient of variation (std / mean); cv = 0 gives the mean n times.

    For X = exp(mu + sigma Z): E[X] = exp(mu + sigma^2 / 2) and CV^2 = exp(sigma^2) - 1, so
    sigma^2 = log(1 + CV^2) and mu = log(mean) - sigma^2 / 2.
    """
    if cv < 0:
        raise ValueError(f"cv must be >= 0, got {cv}")
    if cv == 0:
        return [mean] * n
    sigma2 = math.log1p(cv * cv)
    mu = math.log(mean) - sigma2 / 2
    return [rng.lognormvariate(mu, math.sqrt(sigma2)) for _ in range(n)]


@dataclass(frozen=True)
class Timeline:
    """Event times of one simulated run. Lists are indexed by step, 1..n; index 0 is time 0 (no step)."""

    lag: int
    gen_end: list[float]
    """When the sampler finished batch s."""
    sampler_wait: list[float]
    """How long sampler job s waited for its weights after job s-1 was done."""
    update_start: list[float]
    update_end: list[float]
    """When update t was done: the weights w_t exist from then on."""


def simulate(gen: list[float], update: list[float], push_s: float, lag: int) -> Timeline:
    """Runs the schedule of the module docstring for len(gen) steps: gen[s-1] = G_s, update[t-1] = U_t."""
    if lag < 0:
        raise ValueError(f"lag must be >= 0, got {lag}")
    if len(gen) != len(update):
        raise ValueError(f"gen and update must have one time per step, got {len(gen)} and {len(update)}")
    n = len(gen)
    gen_end, sampler_wait = [0.0] * (n + 1), [0.0] * (n + 1)
    update_start, update_end = [0.0] * (n + 1), [0.0] * (n + 1)
    for s in range(1, n + 1):
        version = s - 1 - lag  # batch s is sampled with w_version; w_0 (initial) needs no update and no push
        weights_ready = update_end[version] if version >= 1 else 0.0
        start = max(gen_end[s - 1], weights_ready)
        sampler_wait[s] = start - gen_end[s - 1]
        gen_end[s] = start + (push_s if version >= 1 else 0.0) + gen[s - 1]
        update_start[s] = max(gen_end[s], update_end[s - 1])
        update_end[s] = update_start[s] + update[s - 1]
    return Timeline(lag, gen_end, sampler_wait, update_start, update_end)


@dataclass(frozen=True)
class SteadyState:
    """Steps warmup+1..n of a timeline: the start-up (the first K batches wait for nothing) left out."""

    lag: int
    step_s: float
    """Wall time per step: (update_end[n] - update_end[warmup]) / (n - warmup)."""
    trainer_wait: float
    """Share of that wall time the trainer waits for a batch."""
    sampler_wait: float
    """Share of that wall time the sampler waits for weights."""


def steady_state(timeline: Timeline, warmup: int) -> SteadyState:
    n = len(timeline.update_end) - 1
    if not 0 <= warmup < n:
        raise ValueError(f"warmup must be in [0, {n}), got {warmup}")
    span = timeline.update_end[n] - timeline.update_end[warmup]
    trainer_wait = sum(
        timeline.update_start[t] - timeline.update_end[t - 1] for t in range(warmup + 1, n + 1)
    )
    sampler_wait = sum(timeline.sampler_wait[warmup + 1 : n + 1])
    return SteadyState(timeline.lag, span / (n - warmup), trainer_wait / span, sampler_wait / span)


def warmup_steps(steps: int, max_lag: int) -> int:
    """Steps left out before the steady state: a tenth of the run, and at least 10 (K + 1)."""
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag}")
    warmup = max(steps // 10, 10 * (max_lag + 1))
    if steps < 2 * warmup:
        raise ValueError(f"steps must be >= {2 * warmup} for lags up to {max_lag}, got {steps}")
    return warmup


def sweep(
    scenario: Scenario, max_lag: int, steps: int, gen_cv: float, update_cv: float, seed: int
) -> list[SteadyState]:
    """Steady state for K = 0..max_lag, every K on the same draws of G and U."""
    rng = random.Random(seed)
    gen = lognormal_times(scenario.gen_s, gen_cv, steps, rng)
    update = lognormal_times(scenario.update_s, update_cv, steps, rng)
    warmup = warmup_steps(steps, max_lag)
    return [steady_state(simulate(gen, update, scenario.push_s, lag), warmup) for lag in range(max_lag + 1)]


def format_table(results: list[SteadyState], unit: str) -> str:
    sync = results[0].step_s
    lines = [f"  K  {unit + '/step':>12}  speed-up vs K=0  trainer waits  sampler waits for weights"]
    for r in results:
        lines.append(
            f"  {r.lag}  {r.step_s:12.5g}  {sync / r.step_s:14.2f}x  {r.trainer_wait:12.1%}"
            f"  {r.sampler_wait:25.1%}"
        )
    return "\n".join(lines)


def report(scenario: Scenario, args: argparse.Namespace) -> str:
    results = sweep(scenario, args.max_lag, args.steps, args.gen_cv, args.update_cv, args.seed)
    u = scenario.unit
    return "\n".join(
        [
            f"== {scenario.name} ==",
            f"source: {scenario.source}",
            f"inputs: G = {scenario.gen_s:g} {u}, U = {scenario.update_s:g} {u}, P = {scenario.push_s:g} {u}; "
            f"CV of G {args.gen_cv:g}, CV of U {args.update_cv:g} (command line, not from the source); "
            f"{args.steps} steps, first {warmup_steps(args.steps, args.max_lag)} left out, seed {args.seed}",
            f"the source reported: {scenario.reported or '-'}",
            "assumes sampler and trainer on separate devices, neither slowing the other (docstring: Two devices)",
            format_table(results, u),
        ]
    )


def _near(a: float, b: float, tol: float = 1e-9) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(b))


def _constant_case(gen_s: float, update_s: float, push_s: float) -> list[SteadyState]:
    scenario = Scenario("check", gen_s, update_s, push_s, source="hand-computed")
    return sweep(scenario, max_lag=3, steps=400, gen_cv=0.0, update_cv=0.0, seed=0)


def check() -> None:
    """Hand-computed cases, asserted; prints one line for each that holds."""
    # G = 3, U = 2, P = 0. K = 0: 3 + 2 = 5 a step; the trainer idles while the sampler works (3 of 5)
    # and the sampler waits for the update (2 of 5). K >= 1: max(3, 2) = 3; the trainer idles 1 of 3.
    k0, *async_ = _constant_case(3.0, 2.0, 0.0)
    assert _near(k0.step_s, 5.0) and _near(k0.trainer_wait, 3 / 5) and _near(k0.sampler_wait, 2 / 5), k0
    for r in async_:
        assert _near(r.step_s, 3.0) and _near(r.trainer_wait, 1 / 3) and _near(r.sampler_wait, 0.0), r
    print("ok  G=3 U=2 P=0: K=0 5.0 s/step (G+U), K=1..3 3.0 s/step (max(G, U)); waits 3/5, 2/5 and 1/3, 0")

    # G = 2, U = 3: update-bound. K >= 1: max(2, 3) = 3, the sampler waits for weights 1 of every 3 s.
    k0, *async_ = _constant_case(2.0, 3.0, 0.0)
    assert _near(k0.step_s, 5.0), k0
    for r in async_:
        assert _near(r.step_s, 3.0) and _near(r.trainer_wait, 0.0) and _near(r.sampler_wait, 1 / 3), r
    print("ok  G=2 U=3 P=0: K=0 5.0 s/step, K=1..3 3.0 s/step; sampler waits 1/3, trainer 0")

    # The push is sampler work: K = 0 pays P + G + U = 6; K >= 1 pays max(P + G, U) = max(4, 2) = 4.
    k0, *async_ = _constant_case(3.0, 2.0, 1.0)
    assert _near(k0.step_s, 6.0) and all(_near(r.step_s, 4.0) for r in async_), (k0, async_)
    print("ok  G=3 U=2 P=1: K=0 6.0 s/step (P+G+U), K=1..3 4.0 s/step (max(P+G, U))")

    # The first steps of G = 3, U = 2, P = 1, K = 1, by hand. Batches 1 and 2 use w_0: no wait, no push;
    # they end at 3 and 6. Update 1 runs 3-5, update 2 runs 6-8. Batch 3 needs w_1 (ready at 5): it starts
    # at 6, pushes for 1 and samples for 3, ending at 10; update 3 runs 10-12.
    tl = simulate([3.0] * 3, [2.0] * 3, push_s=1.0, lag=1)
    assert tl.gen_end[1:] == [3.0, 6.0, 10.0] and tl.update_end[1:] == [5.0, 8.0, 12.0], tl
    print("ok  G=3 U=2 P=1 K=1 timeline: batches end at 3, 6, 10; updates at 5, 8, 12")

    # Lognormal draws keep the mean asked for; cv = 0 draws the mean itself.
    draws = lognormal_times(10.0, 0.5, 200_000, random.Random(0))
    assert abs(sum(draws) / len(draws) - 10.0) < 0.05, sum(draws) / len(draws)
    assert lognormal_times(10.0, 0.0, 3, random.Random(0)) == [10.0] * 3
    print("ok  lognormal draws: mean within 0.5% of 10 at CV 0.5; CV 0 is constant")

    # Varying times, the same draws for every K: K = 0 takes exactly the mean of P + G + U over the
    # window, and a larger lag only removes waits, so the last update never ends later.
    rng = random.Random(1)
    gen, update = lognormal_times(3.0, 0.5, 2000, rng), lognormal_times(2.0, 0.2, 2000, rng)
    ends = [simulate(gen, update, 0.5, lag).update_end[-1] for lag in range(4)]
    assert all(ends[k + 1] <= ends[k] + 1e-9 for k in range(3)), ends
    sync = steady_state(simulate(gen, update, 0.5, 0), 200)
    assert _near(sync.step_s, 0.5 + (sum(gen[200:]) + sum(update[200:])) / 1800), sync
    print(
        f"ok  CV 0.5/0.2: K=0 is the mean of P+G+U; the last update ends at {', '.join(f'{e:.0f}' for e in ends)} s"
    )
    print("all checks passed")


def user_scenario(args: argparse.Namespace, name: str) -> Scenario:
    missing = [
        flag for flag, value in (("--gen-s", args.gen_s), ("--update-s", args.update_s)) if value is None
    ]
    if missing:
        raise SystemExit(f"{name} needs {' and '.join(missing)} (seconds, measured)")
    return Scenario(
        name=name,
        gen_s=args.gen_s,
        update_s=args.update_s,
        push_s=args.push_s if args.push_s is not None else 0.0,
        source="user input (command line: --gen-s, --update-s, --push-s)",
    )


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    own_times = any(v is not None for v in (args.gen_s, args.update_s, args.push_s))
    if args.preset == OWN_PRESET or (args.preset is None and own_times):
        return [user_scenario(args, args.preset or "user")]
    if own_times:
        raise SystemExit(f"--gen-s, --update-s and --push-s go with --preset {OWN_PRESET} or no --preset")
    if args.preset in (None, "all"):
        return list(PRESETS.values())
    return [PRESETS[args.preset]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--check", action="store_true", help="run the hand-computed checks and stop")
    p.add_argument(
        "--preset",
        choices=[*PRESETS, OWN_PRESET, "all"],
        help="a scenario (default: all but cpu-this-machine)",
    )
    p.add_argument("--gen-s", type=float, help="G: seconds to generate one batch (mean)")
    p.add_argument("--update-s", type=float, help="U: seconds the trainer is busy per step (mean)")
    p.add_argument(
        "--push-s", type=float, help="P: seconds the sampler spends loading new weights (default 0)"
    )
    p.add_argument("--gen-cv", type=float, default=0.0, help="coefficient of variation of G (lognormal)")
    p.add_argument("--update-cv", type=float, default=0.0, help="coefficient of variation of U (lognormal)")
    p.add_argument("--max-lag", type=int, default=3, help="K runs from 0 to this")
    p.add_argument("--steps", type=int, default=2000, help="steps simulated per K")
    p.add_argument("--seed", type=int, default=0, help="seed of the lognormal draws")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.check:
        check()
        return
    try:
        print("\n\n".join(report(s, args) for s in scenarios(args)))
    except ValueError as e:  # a bad input: say which, without a traceback
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
