"""`make mutants`: hand-chosen mutations of the GRPO math, run against the unit and equivalence tests.

Each mutant is one small edit a plausible bug would make (a sign, a bound, a
normaliser, a mask, a stop-gradient) in grpo/math/algorithm.py, grpo/math/loss.py, grpo/math/objectives.py and grpo/learning/teacher/, the sampler's draw,
the advantage normalisation and its estimators, the objectives, the loss aggregation and its normalisers,
and the way the objective and estimator options reach the loss. The repository is
copied to a temporary folder, each mutant applied there alone, and the tests of
the ``unit`` and ``equivalence`` layers run, with the objective menu's tiny-model steps
(tests/test_objectives_training.py) among them (``-x``: the first failure kills
it). A mutant that survives is a behaviour no test pins down, or an equivalent
mutant (the edit changes nothing observable): each survivor is listed.

    python bench/mutants.py [--only SUBSTRING] [--timeout SECONDS]

Ends with ``mutants: K of N killed``. Not in CI: it takes tens of minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tests that bear on the mutated code first, so that most mutants die in seconds
FIRST = ["tests/test_algorithm.py", "tests/test_objectives.py", "tests/test_async_correction.py", "tests/test_sampler.py", "tests/test_errored_rows.py", "tests/test_rollout.py", "tests/test_streams.py",
         "tests/test_device_contract.py", "tests/test_trainer.py", "tests/test_distill_math.py",
         "tests/test_distillation.py",
         # the one kind of test that sees a process's share of the batch (its first group's index): minutes
         # (a torchrun launch), so after the quick ones; later in the suite, a 900 s timeout came first
         "tests/test_distributed.py"]
# the objective menu through a real trainer step on a tiny model (the model layer, but seconds): after the
# quick unit files, before the minutes of test_distributed.py
MENU = ["tests/test_objectives_training.py"]
A, R, U, B, S = "grpo/math/algorithm.py", "grpo/sampling/next_token.py", "grpo/learning/update.py", "grpo/sampling/rounds.py", "grpo/sampling/prompt_samplers.py"
P = "grpo/math/objectives.py"  # the policy objectives
T = "grpo/run/trainer.py"
L = "grpo/math/loss.py"  # the loss: aggregation, the KL and TIS terms, its metrics
D = "grpo/learning/teacher/divergence.py"  # the teacher term's math
MUTANTS = [  # (file, original, mutated, what the bug would be)
    (A, "centred = grouped - grouped.mean(dim=1, keepdim=True)", "centred = grouped - grouped.mean()",
     "advantages centred on the batch mean, not the group's"),
    (A, "centred = centred / (grouped.std(dim=1, keepdim=True) + eps)",
     "centred = centred / (grouped.std(dim=1, keepdim=True, unbiased=False) + eps)", "the biased std"),
    (A, "centred = centred / (grouped.reshape(-1).std() + eps)", "centred = centred / (grouped.std(dim=1, keepdim=True) + eps)",
     "batch scale taken as each group's std"),
    (A, "    return high.max(dim=1).values > low.min(dim=1).values",
     "    return high.max(dim=1).values >= low.min(dim=1).values", "every group counted as varying"),
    (P, "    delta = (logp - old_logp) * mask", "    delta = (old_logp - logp) * mask",
     "the ratio inverted"),
    (P, "        seq_log_ratio = delta.sum(dim=1) / lengths  # (N,)", "        seq_log_ratio = delta.sum(dim=1)  # (N,)",
     "GSPO's ratio a product, not a geometric mean"),
    (P, "    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)",
     "    clipped_ratio = ratio.clamp(1.0 - clip_high, 1.0 + clip_low)", "the clip bounds swapped"),
    (P, "    return -torch.minimum(ratio * adv, clipped_ratio * adv)",
     "    return -torch.maximum(ratio * adv, clipped_ratio * adv)", "the surrogate's max for min"),
    # the objective menu: a sign or a stop-gradient in each objective, and the option's way to the loss
    (P, "    weight = ratio.clamp(1.0 - p.clip_low, 1.0 + p.clip_high).detach()",
     "    weight = ratio.clamp(1.0 - p.clip_low, 1.0 + p.clip_high)", "cispo's clipped weight without its stop-gradient"),
    (P, "    return Surrogate(-gate * adv, ratio.detach()", "    return Surrogate(gate * adv, ratio.detach()",
     "sapo's loss of the wrong sign"),
    (P, "    loss = (-adv * seq_ratio).expand_as(delta)", "    loss = (adv * seq_ratio).expand_as(delta)",
     "gmpo's loss of the wrong sign"),
    (P, "        moved = torch.exp(logp) - torch.exp(old_logp)  # (N, T)",
     "        moved = torch.exp(old_logp) - torch.exp(logp)  # (N, T)", "dppo_tv's probability move of the wrong sign"),
    (P, "        inside = torch.where(adv > 0, up, down)", "        inside = torch.where(adv < 0, up, down)",
     "dppo_kl's trust region on the wrong side of A"),
    (P, "    weight = ratio.clamp(max=p.ratio_cap).detach()", "    weight = ratio.clamp(max=p.ratio_cap)",
     "dppo's capped weight without its stop-gradient"),
    (U, "objective=cfg.objective, beta=cfg.beta", "objective=\"ppo\", beta=cfg.beta",
     "the objective option read but ppo's loss used"),
    # the estimators: a sign each, and the option's way to the advantages
    (A, "    centred = (values - _masked_mean(values, kept)) * count / (count - 1).clamp(min=1)",
     "    centred = (_masked_mean(values, kept) - values) * count / (count - 1).clamp(min=1)",
     "rloo's advantages of the wrong sign"),
    (A, "    gap = torch.where(kept.any(dim=1), top[:, 0] - top[:, 1], 0.0)  # (B,)",
     "    gap = torch.where(kept.any(dim=1), top[:, 1] - top[:, 0], 0.0)  # (B,)", "passk's margin of the wrong sign"),
    (A, "    return _whiten(values, _token_weight(tokens, kept)).reshape(-1)",
     "    return _whiten(-values, _token_weight(tokens, kept)).reshape(-1)", "reinforce_pp's advantages of the wrong sign"),
    (A, "    kept, values = _kept(grouped, valid, \"reinforce_pp_baseline\")\n"
        "    centred = torch.where(kept, values - _masked_mean(values, kept), 0.0)",
     "    kept, values = _kept(grouped, valid, \"reinforce_pp_baseline\")\n"
        "    centred = torch.where(kept, _masked_mean(values, kept) - values, 0.0)",
     "reinforce_pp_baseline's group baseline of the wrong sign"),
    (T, "group_advantages(batch.rewards, cfg.group_size, estimator=cfg.advantage_estimator,",
     "group_advantages(batch.rewards, cfg.group_size, estimator=\"grpo\",",
     "the estimator option read but grpo's advantages used"),
    (A, "    return torch.exp(delta) - delta - 1.0", "    return torch.exp(delta) - delta", "k3 without its -1"),
    # token and sequence_ratio truncation share one return: each mutant uncaps its own level only
    (A, "        return ratio.clamp(max=cap), capped, torch.zeros_like(capped)",
     "        return (ratio if level == \"token\" else ratio.clamp(max=cap)), capped, torch.zeros_like(capped)",
     "token TIS weights uncapped"),
    (A, "        return ratio.clamp(max=cap), capped, torch.zeros_like(capped)",
     "        return (ratio if level == \"sequence_ratio\" else ratio.clamp(max=cap)), capped, torch.zeros_like(capped)",
     "sequence_ratio TIS weights uncapped"),
    (A, "        ratio = torch.exp(delta.sum(dim=1, keepdim=True)).expand_as(delta)  # prod_t rho_t; inf past float range",
     "        ratio = torch.exp(delta.mean(dim=1, keepdim=True)).expand_as(delta)  # (N, T)",
     "sequence_ratio's ratio a mean over the padded length, not the completion's product"),
    (A, "            inside = seq.abs() <= math.log(cap)", "            inside = seq <= math.log(cap)",
     "sequence-level TIS masks one side only"),
    (L, "    n_seq = float((mask.sum(dim=1) > 0).sum()) if total_sequences is None",
     "    n_seq = float(per_token.shape[0]) if total_sequences is None", "masked sequences counted"),
    (L, "        return masked.sum() / max(float(n_tok), 1.0)", "        return masked.sum() / max(float(mask.numel()), 1.0)",
     "token mean over padding too"),
    (L, "        return (masked.sum(dim=1) / lengths).sum() / max(n_seq, 1.0)",
     "        return masked.sum(dim=1).sum() / max(n_seq, 1.0)", "sequence mean without 1/|o_i|"),
    (L, "        return masked.sum() / (max(n_seq, 1.0) * max_tokens)", "        return masked.sum() / max(n_seq, 1.0)",
     "Dr. GRPO's constant without max_tokens"),
    (L, "        per_token = per_token + beta * kl", "        per_token = per_token - beta * kl",
     "the KL penalty rewarded"),
    (L, "        per_token = per_token * tis_weight", "        per_token = per_token", "TIS weights ignored"),
    (L, "    low = out.clipped & (adv < 0)  # (N, T)", "    low = out.clipped & (adv > 0)  # (N, T)",
     "clip_frac_low counts the wrong side"),
    (R, "        logp = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)",
     "        logp = torch.log_softmax(logits, dim=-1)", "the sampler ignores the temperature"),
    # (drawing from logp.exp() instead is no longer a mutant: logp is the truncated distribution's by then)
    (R, "        probs = kept.softmax(dim=-1)", "        probs = logp.softmax(dim=-1)",
     "top-k/top-p filtering ignored by the draw"),
    (R, "    u = u.clamp(min=torch.finfo(cdf.dtype).tiny)", "    u = u.clamp(min=0.0)",
     "a uniform of exactly 0 draws a masked token"),
    (R, "    return token, logp.gather(1, token.unsqueeze(1)).squeeze(1)",
     "    return token, logp.gather(1, token.unsqueeze(1)).squeeze(1) * 0.5", "wrong sampling log-probs"),
    (U, "part = Minibatch(own, first, float(lengths[rows].sum()), float((lengths[rows] > 0).sum()))",
     "part = Minibatch(own, first, float(lengths.sum()), float((lengths[rows] > 0).sum()))",
     "the token normaliser of the whole batch for each minibatch"),
    (U, "part = Minibatch(own, first, float(lengths[rows].sum()), float((lengths[rows] > 0).sum()))",
     "part = Minibatch(own, first, float(lengths[rows].sum()), float(len(rows)))",
     "masked sequences in the sequence normaliser"),
    (U, "        logp.float(), old_logp, inputs.advantages[sub_rows + part.first * g], sub.mask,",
     "        logp.float(), old_logp, inputs.advantages[sub_rows], sub.mask,", "a process's advantages read from group 0"),
    (U, "    informative = (advantages.view(-1, group_size) != 0).any(dim=1).cpu()  # (B,)",
     "    informative = (advantages.view(-1, group_size) == 0).any(dim=1).cpu()  # (B,)",
     "the informative groups skipped instead of the others"),
    (U, "    return config.lr * min(1.0, step / (config.warmup_steps + 1))", "    return config.lr",
     "no warm-up"),
    # the errored-row policy: a row whose reward is no verdict leaves its group's statistics and the loss
    (A, "    values = torch.where(valid, grouped, 0.0)  # (B, G) invalid rows' values (NaN included) never enter a sum",
     "    values = grouped.nan_to_num()  # (B, G)",
     "an errored row's finite reward (a cut row under mask_truncated) in its group's mean"),
    (A, "    kept = (count >= 2).float() * weight  # (B, G) the rows that get an advantage",
     "    kept = weight  # (B, G) the rows that get an advantage", "a lone valid row's reward in the batch std"),
    (A, "    high = torch.where(valid, grouped, float(\"-inf\"))  # (B, G)",
     "    high = torch.where(valid, grouped, 0.0)  # (B, G)",
     "an errored row makes its group vary"),
    (B, "    valid = (valid & (valid.sum(dim=1, keepdim=True) >= needed)).reshape(-1)  # (N,)",
     "    valid = valid.reshape(-1)  # (N,)", "a group left with one valid row kept in the loss"),
    (B, "    lengths = torch.where(valid.to(batch.lengths.device), batch.lengths, 0)  # (N,)",
     "    lengths = batch.lengths  # (N,)", "errored rows kept in the loss's normaliser"),
    (B, "    nan = rewards.cpu().isnan()", "    nan = rewards.cpu().isinf()", "a failed reward call taken for a verdict"),
    (B, "    errors[env] = 1 + ERROR_CAUSES.index(\"environment\")", "    errors[env] = 0",
     "an environment that raised taken for a verdict"),
    (S, "        v = np.ones_like(r) if valid is None else valid.detach().cpu().numpy().astype(np.float64)  # (B, G)",
     "        v = np.ones_like(r)  # (B, G)", "the frontier sampler counts errored rows as failures"),
    # on-policy distillation (grpo/learning/teacher/): each form's sign or direction, the detachments, the signal
    (D, "    d = (logp - teacher_logp).detach() * mask  # (N, T)", "    d = (teacher_logp - logp).detach() * mask  # (N, T)",
     "the sampled form's sign: away from the teacher"),
    (D, "    d = (logp - teacher_logp).detach() * mask  # (N, T)", "    d = (logp - teacher_logp) * mask  # (N, T)",
     "the sampled form's difference not detached: grad log p added to the score function"),
    (D, "        return (s.exp() * (s - t)).sum(dim=-1)", "        return (s.exp() * (t - s)).sum(dim=-1)",
     "the full form's reverse KL with its sign flipped"),
    (D, "        return (t.exp() * (t - s)).sum(dim=-1)", "        return (s.exp() * (s - t)).sum(dim=-1)",
     "the full form's beta 0 taken as the reverse KL"),
    (D, "    m = torch.logsumexp(torch.stack([s + math.log(1.0 - beta), t + math.log(beta)]), dim=0)  # log m, (M, V)",
     "    m = torch.logsumexp(torch.stack([s + math.log(beta), t + math.log(1.0 - beta)]), dim=0)  # log m, (M, V)",
     "the JSD's mixture weights swapped"),
    (D, "    t = F.log_softmax(teacher_logits.detach().float(), dim=-1)", "    t = F.log_softmax(teacher_logits.float(), dim=-1)",
     "the teacher not detached in the full form"),
    (U, "    skip = cfg.skip_zero_advantage and cfg.beta == 0.0 and learner.teacher is None",
     "    skip = cfg.skip_zero_advantage and cfg.beta == 0.0", "a teacher's groups skipped when their rewards are equal"),
]


def run_tests(copy: Path, timeout: float) -> tuple[bool, str]:
    """Whether the tests fail on the copy (the mutant is killed), and the first failure: the quick unit
    files of FIRST, then the objective menu's tiny-model steps (MENU), then the rest of the unit and
    equivalence layers; each pass only if the one before it passed."""
    # each file named, in this order: given a folder as well, pytest collects the folder in its own order
    rest = sorted(str(p.relative_to(copy)) for p in (copy / "tests").glob("test_*.py")
                  if str(p.relative_to(copy)) not in FIRST + MENU)
    layers = "(unit or equivalence) and not slow"
    passes = [(layers, FIRST[:-1]), ("not slow", MENU), (layers, [FIRST[-1], *rest])]
    deadline = time.monotonic() + timeout
    for marks, files in passes:
        dead, detail = run_pass(copy, marks, files, deadline - time.monotonic())
        if dead or detail == "timed out":
            return dead, detail
    return False, detail


def run_pass(copy: Path, marks: str, files: list[str], timeout: float) -> tuple[bool, str]:
    """One pytest run of ``files`` (``-x``: the first failure ends it) on the copy."""
    env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    # the copy leaves .venv-vllm out: the tests that look for vLLM find the checkout's (else every mutant
    # would be "killed" by a test that fails on the unmutated code too)
    vllm = ROOT / ".venv-vllm" / "bin" / "python"
    if vllm.exists():
        env.setdefault("GRPO_VLLM_PYTHON", str(vllm))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", "-m", marks, *files]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:  # no test failed in the time: not evidence of a kill
        return False, "timed out"
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    return proc.returncode not in (0, 5), failed[0] if failed else last[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the mutants whose description contains this")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one mutant's tests")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if args.only in m[3]]
    killed, survivors = 0, []
    with tempfile.TemporaryDirectory(prefix="grpo-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "__pycache__"))
        for path, original, mutated, why in chosen:
            target = copy / path
            text = target.read_text()
            if text.count(original) != 1:
                print(f"error: {path}: the line to mutate is not there exactly once: {original.strip()!r}")
                return 2
            target.write_text(text.replace(original, mutated))
            start = time.perf_counter()
            try:
                dead, detail = run_tests(copy, args.timeout)
            finally:
                target.write_text(text)
            killed += dead
            if not dead:
                survivors.append(f"{path}: {why}" + (" (timed out)" if detail == "timed out" else ""))
            print(f"{'killed' if dead else 'SURVIVED'} ({time.perf_counter() - start:.0f} s) {path}: {why}"
                  + (f" -- {detail}" if dead else ""), flush=True)
    for survivor in survivors:
        print(f"survivor: {survivor}")
    print(f"mutants: {killed} of {len(chosen)} killed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
