"""GRPO from the library's building blocks, top to bottom: the embedded SmolLM2-135M learns two-digit sums.

    python examples/plain_grpo.py --steps 20

Each step draws B prompts, samples G completions of each, scores them with
the task's checker, turns the rewards into group-relative advantages
A_i = (r_i - mean(r)) / std(r) (Shao et al. 2024, "DeepSeekMath"),
recomputes the sampled tokens' log-probs with gradients, and takes one AdamW
step on the clipped surrogate. Held-out greedy accuracy is measured before
and after. Shapes: B prompts, G completions each, N = B*G, T completion tokens.

Where it deviates from `grpo train` (grpo/run/trainer.py), to stay short:
- prompts are drawn uniformly at random (the trainer's default is the
  frontier sampler, which favours prompts whose groups are likely mixed);
- no dynamic sampling: a group whose G rewards are all equal stays in the
  batch with A_i = 0 and adds nothing but tokens to the normaliser (the
  trainer replaces it with a fresh group, DAPO's filter);
- one optimiser step per batch (mu = 1): pi_old is the policy that sampled,
  so the ratio is 1 up to numerics and the clip does not bite; it is kept
  because the loss is the library's own, and mu > 1 would need it;
- old_logp is the sampler's own log-probs: with one engine there is no
  sampler/trainer mismatch to correct (no truncated importance sampling);
- no KL penalty or reference model, no learning-rate warm-up, no gradient
  clipping, no micro-batches (the whole batch is one forward/backward), no
  reward worker processes or timeouts, no checkpoints, metrics files or
  alarms; one process.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

import grpo


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="GRPO steps, one batch of prompts each")
    p.add_argument("--prompts", type=int, default=4, help="B: prompts per step")
    p.add_argument("--group", type=int, default=8, help="G: completions sampled per prompt")
    p.add_argument("--lr", type=float, default=3e-5, help="AdamW learning rate (the trainer's default)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    p.add_argument("--eval-size", type=int, default=32, help="held-out prompts scored greedily at start and end")
    p.add_argument("--seed", type=int, default=0, help="seed for prompt order and sampling")
    p.add_argument("--save", default="", help="write the trained model and tokenizer to this folder")
    return p.parse_args()


def heldout_accuracy(policy, task, prompts: list[list[int]], max_new_tokens: int) -> float:
    """Share of held-out prompts whose greedy completion earns the full reward."""
    acc, _, _ = grpo.greedy_accuracy(policy.model, policy.tokenizer, prompts, task.heldout, task.reward,
                                     max_new_tokens=max_new_tokens)
    return acc


def main() -> None:
    args = parse_args()
    random.seed(args.seed)
    torch.manual_seed(args.seed)  # generate() draws from torch's global generator
    device = "cuda" if torch.cuda.is_available() else "cpu"

    policy = grpo.load_policy("smollm2", device=device)
    model, tokenizer = policy.model, policy.tokenizer
    task = grpo.load_task("add", heldout_size=args.eval_size)
    max_new_tokens = task.defaults["max_new_tokens"]  # 12: room for "23 + 45 = 68" and its end
    heldout_prompts = grpo.encode_prompts(tokenizer, [task.messages(row) for row in task.heldout])
    # The model stays in eval mode, as from_pretrained leaves it: no dropout, so the training pass
    # scores the very policy that sampled. No weight decay: a step with all A_i = 0 leaves the weights.
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    G = args.group

    start_acc = heldout_accuracy(policy, task, heldout_prompts, max_new_tokens)
    print(f"held-out greedy accuracy at start: {start_acc:.1%} of {len(task.heldout)}", flush=True)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        # Sample: B prompts, G completions each; each prompt's KV cache is shared by its group.
        rows = random.sample(task.train, args.prompts)
        prompts = grpo.encode_prompts(tokenizer, [task.messages(row) for row in rows])
        rollout = grpo.generate(model, tokenizer, prompts, group_size=G, max_new_tokens=max_new_tokens,
                                temperature=args.temperature)

        # Score: a completion cut off by the token limit scores 0 (the checker reads "truncated").
        cut = rollout.truncated.tolist()
        rewards = torch.tensor([task.reward(text, {**rows[i // G], "truncated": cut[i]})
                                for i, text in enumerate(rollout.texts)])  # (N,)
        advantages = grpo.group_advantages(rewards, G).to(device)  # (N,)

        # Update: log-probs of the sampled tokens under the current policy, at the sampling temperature,
        # so that they are the log-probs of the policy that sampled (ratio 1 on this first and only pass).
        logp, _ = grpo.rollout_logprobs(model, rollout, tokenizer.pad_token_id,
                                        temperature=args.temperature)  # (N, T)
        loss, stats = grpo.policy_loss(logp, rollout.logprobs, advantages, rollout.mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        mixed = int((rewards.view(-1, G).std(dim=1) > 0).sum())  # groups with a learning signal
        print(f"step {step:3d}  reward {rewards.mean().item():.3f}  mixed groups {mixed}/{args.prompts}  "
              f"loss {loss.item():+.4f}  ratio {stats['ratio_mean'].item():.4f}  "
              f"{time.time() - t0:.0f}s", flush=True)

    end_acc = heldout_accuracy(policy, task, heldout_prompts, max_new_tokens)
    print(f"held-out greedy accuracy at end: {end_acc:.1%} (start {start_acc:.1%})", flush=True)
    if args.save:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
        print(f"saved to {args.save}")


if __name__ == "__main__":
    main()
