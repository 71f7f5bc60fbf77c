"""``grpo check-reward --reward code_tests``: attack the code reward as a policy would, before training on it.

Every probe is a hostile completion built for each row (it defines the
functions the row's tests call, or for stdin/stdout rows is the program) and
run through the same path as ``code_tests``. A probe *fails the audit* on a
row when it scores above 0, or when it leaves a trace outside the sandbox:

- the trusted side plants canaries first: a secret in its own environment,
  secret files in a fresh folder and in ``$HOME``, a folder it watches for new
  files, a TCP listener on 127.0.0.1, a SIGUSR1 counter;
- after the run it looks for them: the secret in what the sandbox returned,
  a file written outside, a connection received, a signal received, a process
  tagged with the run's token still alive, more memory or disk used than the
  limits allow.

Every probe is bounded so that it cannot hurt the machine even where the
sandbox fails (300 short-lived processes, 2 GB or 4 x 600 MB, 500 MB of files, sleeps of
under 10 s). Rows also report how many of their tests are *forgeable* (assert
shapes the parent cannot check; see :mod:`grpo.rewards.code`), and when a row
has a ``solution`` field, that it scores the maximum, so that a sandbox that
fails everything cannot pass the audit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from grpo.rewards.code import DEFAULT_LIMITS, Case, Verdict, evaluate, row_tests
from grpo.rewards.code_canaries import SECRET_VARIABLE as SECRET_VARIABLE  # importable here, as before
from grpo.rewards.code_canaries import Canaries, alive_with, planted, tokens_received, written_outside
from grpo.rewards.code_probes import PROBES, called_names, probe_code
from grpo.rewards.sandbox import Limits, sandbox_mode

_alive_with = alive_with  # tests/test_sandbox.py imports it from here by its old name


@dataclass(frozen=True)
class ProbeRun:
    """One probe on one row: the code, its token (names its files, processes and messages)."""

    probe: str
    row: int
    code: str
    token: str
    peek: str = ""  # a test line of the row: seeing it in the output means the code read the tests


def _peek(cases: Sequence[Case]) -> str:
    """A piece of the row's tests that only the tests hold: an expected value in context, or an assert."""
    for case in cases:
        if case.kind == "checked":
            return f"{case.source} == {case.expected!r}"
        if case.kind == "io" and len(str(case.expected).strip()) >= 8:
            return str(case.expected).strip()
    return ""


def traces(run: ProbeRun, verdict: Verdict, canaries: Canaries, limits: Limits) -> list[str]:
    """What ``run`` left outside the sandbox (and cleans it up): one phrase per kind of trace."""
    found = []
    if canaries.secret in verdict.output:
        found.append("read a secret")
    if run.peek and (run.peek in verdict.output or json.dumps(run.peek)[1:-1] in verdict.output):
        found.append("read the row's tests")
    alive = alive_with(run.token)  # killed first, so that none writes after the files are listed
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    written = written_outside(canaries, run.token)
    for path in written:
        with contextlib.suppress(OSError):
            path.unlink()
    if written:
        found.append(f"wrote {written[0]}")
    if alive:
        found.append(f"{len(alive)} processes outlived the run")
    if f"allocated {run.token}" in verdict.output:
        found.append("allocated 2 GB")
    written, forked = _reported(verdict.output, "wrote", run.token), _reported(verdict.output, "forked", run.token)
    if written > 2 * limits.disk_mb * 1024**2:  # more than the two tmpfs hold: it wrote to the host
        found.append(f"wrote {written // 1024**2} MB")
    held = _reported(verdict.output, "held", run.token)
    if held * 600 > limits.memory_mb:
        found.append(f"{held} processes held 600 MB each")
    if forked >= limits.max_processes:
        found.append(f"started {forked} processes")
    return found


def _reported(output: str, word: str, token: str) -> int:
    """The largest N of the "{word} N {token}" a probe returned (0 when none)."""
    numbers = re.findall(rf"{word} (\d+) {token}", output)
    return max(map(int, numbers), default=0)


@dataclass(frozen=True)
class ProbeOutcome:
    name: str
    rows: int
    scored: int  # rows where the probe scored above 0
    traced: int  # rows where it left a trace outside the sandbox
    example: str  # the first trace or score seen, for the report


@dataclass(frozen=True)
class CodeAuditReport:
    reward: str
    mode: str
    outcomes: list[ProbeOutcome]
    tests: int
    forgeable: int
    gold_rows: int
    gold_max: int

    def failures(self) -> list[str]:
        """Probe names that scored or left a trace, and a gold check that failed."""
        bad = [o.name for o in self.outcomes if o.scored or o.traced]
        if self.gold_max < self.gold_rows:
            bad.append("gold solutions")
        return bad

    def table(self) -> str:
        lines = [f"reward {self.reward}, sandbox {self.mode}",
                 f"{'probe':<40}{'rows':>6}{'scored':>8}{'traces':>8}  verdict"]
        for o in self.outcomes:
            verdict = "FAIL: " + o.example if o.scored or o.traced else "ok"
            lines.append(f"{o.name:<40}{o.rows:>6}{o.scored:>8}{o.traced:>8}  {verdict}")
        failing = sum(bool(o.scored or o.traced) for o in self.outcomes)
        lines.append(f"exploits tried: {len(self.outcomes)} on every row; scoring or leaving a trace: {failing}")
        lines.append(f"forgeable tests (assert shapes the parent cannot check): {self.forgeable} of {self.tests}")
        gold = f"{self.gold_max}/{self.gold_rows}" if self.gold_rows else "n/a (no solution field)"
        lines.append(f"gold solutions scoring the maximum: {gold}")
        return "\n".join(lines)


def _score(verdict: Verdict) -> float:
    return verdict.passed / verdict.total if verdict.total else 0.0


def _outcome(name: str, results: list[tuple[float, list[str]]]) -> ProbeOutcome:
    scored = [s for s, _ in results if s > 0]
    traced = [t for _, t in results if t]
    example = traced[0][0] if traced else (f"scored {scored[0]:.2f}" if scored else "")
    return ProbeOutcome(name, len(results), len(scored), len(traced), example)


def _run(run: ProbeRun, tests: list[Case], canaries: Canaries, limits: Limits, mode: str) -> tuple[float, list[str]]:
    verdict = evaluate(run.code, tests, limits, mode=mode)
    return _score(verdict), traces(run, verdict, canaries, limits)


def _late_traces(runs: Sequence[ProbeRun], canaries: Canaries) -> dict[int, list[str]]:
    """Traces seen only once every run is over: connections received, signals received."""
    received = tokens_received(canaries)
    late: dict[int, list[str]] = {}
    for k, run in enumerate(runs):
        if run.token in received:
            late.setdefault(k, []).append("connected to the listener")
        if run.probe.startswith("signalling") and canaries.signals:
            late.setdefault(k, []).append("signalled the parent")
    return late


def audit_code_reward(
    rows: Sequence[Mapping],
    *,
    reward: str = "code_tests",
    mode: str | None = None,
    workers: int = 2,
    limits: Limits = DEFAULT_LIMITS,
    probes: Mapping[str, str] = PROBES,
) -> CodeAuditReport:
    """Run every probe on every row; see the module docstring."""
    mode = mode or sandbox_mode()
    tests = [row_tests(row) for row in rows]
    with planted() as canaries, ThreadPoolExecutor(max(workers, 1)) as pool:
        runs = []
        for name, body in probes.items():
            for i, cases in enumerate(tests):
                token = str(secrets.randbelow(10**10)).zfill(10)  # digits: also a valid sleep time
                runs.append(ProbeRun(name, i, probe_code(body, called_names(cases), canaries, token), token,
                                _peek(cases)))
        results = list(pool.map(lambda r: _run(r, tests[r.row], canaries, limits, mode), runs))
        for k, more in _late_traces(runs, canaries).items():
            results[k] = (results[k][0], results[k][1] + more)
        gold = [pool.submit(evaluate, str(row["solution"]), t, limits, mode=mode)
                for row, t in zip(rows, tests, strict=True) if row.get("solution")]
        gold_max = sum(_score(g.result()) == 1.0 for g in gold)
    outcomes = [_outcome(name, [res for r, res in zip(runs, results, strict=True) if r.probe == name])
                for name in probes]
    graded = [t for cases in tests for t in cases if t.kind != "setup"]
    return CodeAuditReport(reward, mode, outcomes, len(graded), sum(t.kind == "opaque" for t in graded),
                           len(gold), gold_max)
