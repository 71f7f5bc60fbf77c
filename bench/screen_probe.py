"""How well the prompt-end hidden state predicts which groups vary, by layer, on the starting model.

    python bench/screen_probe.py [--task add | --data FILE] [--model M] [--prompts 256] [--threads 1]
        [--target pass|varies] [--out FILE]

Samples a group of G completions for each of N training prompts with the starting policy, as step 1's
first round would (grpo/sampling/rounds.py generate_round: the run's sampler settings, token limit and rewards),
then reads the hidden state at each prompt's end after every layer (one prompt at a time, no padding).
For each layer it fits grpo/sampling/screen.py's predictor (the fractional logistic regression on standardised
features, the ridge chosen as the screen chooses it) with 4-fold cross-validation, and prints, from the
held-out folds' predictions:

- the share of groups that vary among all N, and among the quarter (and the half) ranked likeliest to
  vary by P(mixed) = 1 - p^G - (1 - p)^G: what a screen of 4 (2) candidates a group would generate;
- the log-loss of the predicted pass fraction against the base rate's.

With ``--target varies`` the ranking comes from a logistic regression fitted directly on whether each
group varied, rather than from P(mixed) of the predicted pass fraction: when a prompt's completions are
mostly all right or all wrong (a pass rate per prompt near 0 or 1), a predicted pass fraction near 0.5
means "not sure which", not "mixed", and the screen's formula ranks those prompts first.

The last layer's state is what the screen uses now; an earlier layer would cost a fraction of the
prefill. It also prints how well one completion of each group (the ``probe`` screen's features: its
probability, its least likely token's, its reward) predicts whether the group's other G - 1 vary. The last
line is a JSON object with the figures; ``--out FILE`` also writes each prompt's row,
pass fraction and whether its group varied.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo.config import TrainConfig  # noqa: E402
from grpo.run.build import resolve_run  # noqa: E402
from grpo.run.process_setup import setup_process  # noqa: E402
from grpo.run.trainer import GRPOTrainer  # noqa: E402
from grpo.sampling.rounds import Round, generate_round, probe_rows, reordered_rounds  # noqa: E402
from grpo.sampling.screen import RIDGES, fit_logistic, log_loss, mixed_chance, sigmoid  # noqa: E402


def layer_states(model: torch.nn.Module, prompts: list[list[int]]) -> np.ndarray:
    """(L + 1, N, H): the hidden state at each prompt's last token after the embedding and every layer."""
    out = []
    with torch.no_grad():
        for ids in prompts:
            hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            out.append(torch.stack([h[0, -1] for h in hidden]).float().numpy())
    return np.stack(out, axis=1)


def cross_validated(x: np.ndarray, y: np.ndarray, w: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """(N,) each group's predicted pass fraction from a fit on the other folds."""
    rng = np.random.default_rng(seed)
    fold = rng.permutation(len(y)) % folds
    pred = np.zeros(len(y))
    for k in range(folds):
        train, test = fold != k, fold == k
        mu, sigma = x[train].mean(axis=0), x[train].std(axis=0) + 1e-6
        z = (x - mu) / sigma
        inner = rng.random(train.sum()) < 0.25
        zt, yt, wt = z[train], y[train], w[train]
        ridge = min(RIDGES, key=lambda r: log_loss(fit_logistic(zt[~inner], yt[~inner], wt[~inner], r),
                                                   zt[inner], yt[inner], wt[inner]))
        beta = fit_logistic(zt, yt, wt, ridge)
        pred[test] = sigmoid(beta[0] + z[test] @ beta[1:])
    return pred


def first_completion_features(r: Round, g: int) -> np.ndarray:
    """(n, 5) the ``probe`` screen's features (grpo/sampling/rounds.py probe_rows) of each group's first completion."""
    first = torch.arange(0, len(r.rewards), g)  # (n,) each group's first row
    reward = torch.where(r.valid().reshape(-1)[first], r.rewards[first], 0.0)
    return probe_rows(r.rollout.logprobs[first], r.rollout.mask[first] > 0, reward, r.truncated[first])


def probe_ranking(x: np.ndarray, rewards: torch.Tensor, valid: torch.Tensor, seed: int) -> None:
    """Print how well one completion predicts whether the other G - 1 of its group vary (the first stands
    for the probe, the rest for the group generated after it): the share that vary among the quarter
    (half) ranked likeliest by a cross-validated logistic regression on the probe's features, the area
    under the ROC curve, and the same ranked by the first completion's probability alone (lowest first)."""
    varies = np.array([len(set(rw[v].tolist())) > 1 for rw, v in zip(rewards, valid, strict=True)])
    pred = cross_validated(x, varies.astype(float), np.ones(len(varies)), 4, seed)

    def line(name: str, score: np.ndarray) -> None:
        order = np.argsort(-score, kind="stable")
        rank = np.empty(len(score))
        rank[order[::-1]] = np.arange(len(score))  # 0 for the lowest score
        pos = varies.sum()
        auc = (rank[varies].sum() - pos * (pos - 1) / 2) / max(pos * (len(score) - pos), 1)
        print(f"probe, {name}: of the other {rewards.shape[1]}, {varies.mean():.1%} vary; top quarter "
              f"{varies[order[: len(score) // 4]].mean():.1%}, top half {varies[order[: len(score) // 2]].mean():.1%}, "
              f"AUC {auc:.3f}")

    line("fitted on its features", pred)
    line("its probability alone, lowest first", -x[:, 0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="add")
    p.add_argument("--data", default="")
    p.add_argument("--model", default="smollm2", help="the policy to probe (a trained run's RUN/model, say)")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: the task's setting")
    p.add_argument("--temperature", type=float, default=0.0, help="0: the run's default")
    p.add_argument("--target", choices=("pass", "varies"), default="pass",
                   help="rank by P(mixed) from the predicted pass fraction, as the screen does (pass), or by a "
                        "regression fitted on whether each group varied (varies)")
    p.add_argument("--out", default="", help="also write each prompt's row, pass fraction and whether its group "
                                               "varied to this JSON file")
    args = p.parse_args()
    extra = {"data": args.data} if args.data else {"task": args.task}
    if args.max_new_tokens:
        extra["max_new_tokens"] = args.max_new_tokens
    if args.temperature:
        extra["temperature"] = args.temperature
    config = TrainConfig.from_dict({"model": args.model, "threads": args.threads, "seed": args.seed, "eval_size": 1, "save_model": False,
                                    "sample_every": 0, "log_every": 0, "preflight": "off", **extra})
    setup_process(config)
    trainer = GRPOTrainer(resolve_run(config), progress=False)
    sampling, g = trainer.sampling, trainer.config.group_size
    drawn = sampling.drawing.sampler.draw(args.prompts, 1)
    start = time.perf_counter()
    rewards, valid, probes = [], [], []
    with reordered_rounds(sampling.generation):
        for k in range(0, len(drawn), 32):
            r = generate_round(sampling, drawn[k : k + 32], 1, k // 32)
            rewards.append(r.rewards.view(-1, g))
            valid.append(r.valid().view(-1, g))
            probes.append(first_completion_features(r, g))
    seconds_generate = time.perf_counter() - start
    rewards, valid = torch.cat(rewards).float(), torch.cat(valid)
    probe_ranking(np.concatenate(probes), rewards[:, 1:], valid[:, 1:], args.seed)
    w = valid.float().sum(1).numpy()
    y = ((rewards.clamp(0, 1) * valid).sum(1).numpy() / np.maximum(w, 1))
    varies = np.array([len(set(rw[v].tolist())) > 1 for rw, v in zip(rewards, valid, strict=True)])
    start = time.perf_counter()
    states = layer_states(sampling.generation.model, [sampling.train_prompts[i] for i in drawn])
    seconds_states = time.perf_counter() - start
    trainer.close()
    if args.out:
        Path(args.out).write_text(json.dumps([{"row": sampling.task.train[i], "pass": float(q), "varies": bool(v)}
                                              for i, q, v in zip(drawn, y, varies, strict=True)]))
    base = float((w * y).sum() / w.sum())
    base_loss = log_loss(np.array([np.log(base / (1 - base))]), np.zeros((len(y), 0)), y, w)
    print(f"{config.task or config.data}: {len(y)} prompts x G={g}, pass rate {base:.1%}, groups that vary "
          f"{varies.mean():.1%}; generation {seconds_generate:.0f} s, hidden states {seconds_states:.0f} s")
    print(f"{'layer':>6} {'top quarter vary':>17} {'top half vary':>14} {'log-loss':>9} (base {base_loss:.4f})")
    figures = {"varies": float(varies.mean()), "pass_rate": base, "base_log_loss": base_loss, "layers": {}}
    for layer in range(1, states.shape[0]):
        if args.target == "varies":  # P(the group varies) fitted directly on whether each one did
            order = np.argsort(-cross_validated(states[layer], varies.astype(float), np.ones(len(y)), 4, args.seed),
                               kind="stable")
            pred = cross_validated(states[layer], y, w, 4, args.seed)
        else:
            pred = cross_validated(states[layer], y, w, 4, args.seed)
            order = np.argsort(-mixed_chance(pred, g), kind="stable")
        quarter, half = varies[order[: len(y) // 4]].mean(), varies[order[: len(y) // 2]].mean()
        logit = np.log(np.clip(pred, 1e-6, 1 - 1e-6) / np.clip(1 - pred, 1e-6, 1))
        loss = log_loss(np.array([0.0, 1.0]), logit[:, None], y, w)  # the prediction itself, weighted as base
        figures["layers"][layer] = {"top_quarter_varies": float(quarter), "top_half_varies": float(half),
                                    "log_loss": loss}
        print(f"{layer:>6} {quarter:>17.1%} {half:>14.1%} {loss:>9.4f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
