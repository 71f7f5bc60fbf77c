"""``grpo check-reward``: audit an answer-checking reward on a dataset before training on it.

Two kinds of probe, each run on every row:

- *gold forms*: the row's gold answer written as a user might (plain, boxed,
  "The answer is ...", "#### ...", with thousands separators, as a fraction)
  must score the reward's maximum;
- *exploits*: outputs that must score the minimum (empty, the question echoed,
  the question's numbers echoed with no answer marked, every integer 0..1000,
  two boxed answers, "A or B", 100 kB of text, the answer only in the
  reasoning, a different row's gold answer, and the gold answer in a
  completion that was cut off by the token limit: the row is marked
  ``truncated`` as the trainer marks it, and a cut answer is no answer).

Rewards that demand a layout (``think_format``, R1-style answer tags) are
detected by scoring the first row both bare and wrapped in
``<think>..</think><answer>..</answer>``; the winning layout is used for all probes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from grpo.rewards.combine import RewardFn, RewardScorer
from grpo.rewards.styles import check_style

# (row, another row) -> completion, or (completion, fields the trainer adds to the row); None when n/a
Probe = Callable[[Mapping, Mapping | None], "str | tuple[str, dict] | None"]


def _number(answer: str) -> Fraction | None:
    try:
        return Fraction(answer.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def _other(answer: str) -> str:
    """A different answer of the same kind: the gold value plus one, or a changed string."""
    value = _number(answer)
    return str(value + 1) if value is not None else answer + "x"


def _thousands(row: Mapping, _: Mapping) -> str | None:
    value = _number(str(row["answer"]))
    if value is None or value.denominator != 1 or abs(value) < 1000:
        return None
    return f"The answer is {int(value):,}."


def _fraction(row: Mapping, _: Mapping) -> str | None:
    value = _number(str(row["answer"]))
    if value is None or value.denominator == 1:
        return None
    return f"The answer is \\boxed{{\\frac{{{value.numerator}}}{{{value.denominator}}}}}."


GOLD_FORMS: dict[str, Probe] = {
    "plain": lambda r, _: str(r["answer"]),
    "boxed": lambda r, _: f"So the total is \\boxed{{{r['answer']}}}.",
    "the answer is": lambda r, _: f"Adding it all up. The answer is {r['answer']}.",
    "#### answer": lambda r, _: f"Working.\n#### {r['answer']}",
    "thousands separators": _thousands,
    "fraction": _fraction,
}

_ALL_INTEGERS = ", ".join(str(i) for i in range(1001))
_PROMPT_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _operands_echoed(row: Mapping, _: Mapping | None) -> str | None:
    """The prompt's own numbers restated, nothing marked as the answer ("76 - 38 equals" cut short).

    Where the gold answer is one of them (76 - 38 = 38) it comes last, where a last-number checker looks.
    """
    numbers = _PROMPT_NUMBER.findall(str(row["prompt"]))[-3:]
    if not numbers:
        return None
    gold = str(row["answer"]).strip()
    numbers = [n for n in numbers if n != gold] + [n for n in numbers if n == gold]
    return "Let me see: " + " and ".join(numbers) + ", so it equals"


def _cut_off(row: Mapping, _: Mapping | None) -> tuple[str, dict]:
    """The gold answer inside a completion that hit the token limit (the number may be cut)."""
    return f"The answer is {row['answer']}", {"truncated": True}

EXPLOITS: dict[str, Probe] = {
    "empty output": lambda r, _: "",
    "question echoed": lambda r, _: str(r["prompt"]),
    "question's numbers echoed": _operands_echoed,
    "cut off by the token limit": _cut_off,
    "every integer 0..1000": lambda r, _: _ALL_INTEGERS,
    "several boxed answers": lambda r, _: f"\\boxed{{{r['answer']}}} or maybe \\boxed{{{_other(str(r['answer']))}}}",
    "A or B": lambda r, _: f"The answer is {r['answer']} or {_other(str(r['answer']))}.",
    "100 kB output": lambda r, _: "Let me think. " * 7200 + f"The answer is {r['answer']}.",
    "another row's answer": lambda r, other: None if other is None else f"The answer is {other['answer']}.",
}


@dataclass(frozen=True)
class ProbeResult:
    """One probe over the rows: how many it applied to, and how many passed (gold: scored the max;
    exploit: scored above the min)."""

    name: str
    kind: str
    rows: int
    passed: int

    @property
    def rate(self) -> float:
        return self.passed / self.rows if self.rows else float("nan")


@dataclass(frozen=True)
class AuditReport:
    reward: str
    layout: str
    results: list[ProbeResult]
    max_gold_failure: float

    def failures(self) -> list[ProbeResult]:
        """Gold forms failing above the allowed rate, and exploits that passed on any row."""
        bad = []
        for r in self.results:
            if r.kind == "gold" and r.rows and 1 - r.rate > self.max_gold_failure:
                bad.append(r)
            if r.kind == "exploit" and r.passed:
                bad.append(r)
        return bad

    def table(self) -> str:
        lines = [f"reward {self.reward}, layout {self.layout}", f"{'probe':<28}{'kind':<9}{'rows':>7}{'pass rate':>11}  verdict"]
        failing = {id(r) for r in self.failures()}
        for r in self.results:
            rate = "n/a" if not r.rows else f"{r.rate:.2%}"
            verdict = "-" if not r.rows else ("FAIL" if id(r) in failing else "ok")
            lines.append(f"{r.name:<28}{r.kind:<9}{r.rows:>7}{rate:>11}  {verdict}")
        gold = [r for r in self.results if r.kind == "gold" and r.rows]
        g_pass, g_rows = sum(r.passed for r in gold), sum(r.rows for r in gold)
        exploits = sum(1 for r in self.results if r.kind == "exploit" and r.passed)
        probed = any(r.kind == "exploit" for r in self.results)  # grpo data audits the gold forms alone
        lines.append(f"gold forms scoring the maximum: {g_pass}/{g_rows} ({g_pass / max(g_rows, 1):.2%})"
                     + (f"; exploit probes passing: {exploits}" if probed else ""))
        return "\n".join(lines)


def _tagged(text: str) -> str:
    return f"<think>I worked it out step by step.</think>\n<answer>{text}</answer>"


def _pick_layout(scorer: RewardScorer, row: Mapping, best: float) -> Callable[[str], str]:
    plain = f"The answer is {row['answer']}."
    bare, tagged = scorer([plain, _tagged(plain)], [row, row])[0].tolist()
    return _tagged if tagged >= best and bare < best else (lambda text: text)


def audit_reward(
    reward: RewardFn,
    rows: Sequence[Mapping],
    *,
    best: float = 1.0,
    worst: float = 0.0,
    max_gold_failure: float = 0.005,
    workers: int = 2,
    timeout: float = 30.0,
    style: str = "auto",
    exploits: bool = True,
) -> AuditReport:
    """Run every gold form and (with ``exploits``) every exploit probe on every row, the reward called in
    ``style`` (auto: read from its signature; see grpo.rewards.styles); see the module docstring."""
    scorer = RewardScorer([reward], workers=workers, timeout=timeout, styles=[check_style(reward, style)])
    try:
        layout = _pick_layout(scorer, rows[0], best)
        probes = [(name, "gold", p, True) for name, p in GOLD_FORMS.items()]
        probes += [(name, "exploit", p, True) for name, p in EXPLOITS.items() if exploits]
        if layout is _tagged and exploits:  # the reward demands tags: an answer left in the reasoning must not count
            probes.append(("answer only in reasoning", "exploit", _in_reasoning, False))
        others = [_different_row(rows, i) for i in range(len(rows))]
        texts, owners = [], []
        for k, (_, _, probe, wrap) in enumerate(probes):
            for row, other in zip(rows, others, strict=True):
                made = probe(row, other)
                if made is None:
                    continue
                text, extra = made if isinstance(made, tuple) else (made, {})
                texts.append(layout(text) if wrap else text)
                owners.append((k, {**row, **extra}))
        scores = scorer(texts, [row for _, row in owners])[0].tolist()
    finally:
        scorer.close()
    results = []
    for k, (name, kind, _, _) in enumerate(probes):
        mine = [s for (j, _), s in zip(owners, scores, strict=True) if j == k]
        passed = sum(s >= best for s in mine) if kind == "gold" else sum(s > worst for s in mine)
        results.append(ProbeResult(name, kind, len(mine), passed))
    name = getattr(reward, "__name__", type(reward).__name__)
    return AuditReport(name, "think/answer tags" if layout is _tagged else "bare", results, max_gold_failure)


def _in_reasoning(row: Mapping, _: Mapping | None) -> str:
    return f"<think>The answer is {row['answer']}.</think>\n<answer></answer>"


def _different_row(rows: Sequence[Mapping], i: int) -> Mapping | None:
    """The nearest following row whose answer differs from row i's (as text and as a number)."""
    mine = str(rows[i]["answer"]).strip()
    for step in range(1, len(rows)):
        other = rows[(i + step) % len(rows)]
        theirs = str(other["answer"]).strip()
        if theirs != mine and (_number(theirs) is None or _number(theirs) != _number(mine)):
            return other
    return None
