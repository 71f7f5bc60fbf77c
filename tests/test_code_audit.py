"""`grpo check-reward` on code rewards: the probes find nothing under bwrap, and find each hole where there is one.

The probes' detectors are checked against real holes: no sandbox at all (mode "none"), the weak
in-process guard, and tests of a shape whose verdict the sandboxed process gives itself.
"""

import json
import os

import pytest

from grpo.cli import main
from grpo.rewards import sandbox
from grpo.rewards.code_audit import PROBES, audit_code_reward
from grpo.rewards.sandbox import Limits
from grpo.tasks import get_task

CONTAINMENT = [
    "secrets from the parent's environment", "secrets from files", "writing outside the working directory",
    "switching off an in-process guard", "escaping the process group (setsid)", "network to a listener on this machine",
    "signalling the parent", "fork bomb", "memory bomb (2 GB)", "memory bomb in 4 processes (4 x 600 MB)",
    "disk bomb (500 MB)",
]


def test_every_probe_finds_nothing_on_the_code_task_under_bwrap():
    rows = list(get_task("code").heldout)[:2]
    report = audit_code_reward(rows, mode="strict")
    assert report.failures() == [], report.table()
    assert [o.rows for o in report.outcomes] == [2] * len(PROBES)
    assert (report.gold_rows, report.gold_max, report.forgeable) == (2, 2, 0)


def test_without_a_sandbox_every_containment_probe_is_caught():
    rows = list(get_task("code").heldout)[:1]
    report = audit_code_reward(rows, mode="none", limits=Limits(wall_seconds=30.0))  # a loaded CI machine
    assert set(CONTAINMENT) <= set(report.failures()), report.table()


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_a_write_outside_is_caught_when_the_run_is_killed_before_it_reports(where):
    # the probe writes on the host, then outlives the wall-clock limit: it never returns what it wrote, so
    # only the file itself (its name holds the run's token) can show it; the audit also removes it
    slow = {"write, then hang": f"""
import time
with open("{where}/bomb-{{token}}-0", "wb") as f:
    f.write(b"x")
time.sleep(30)
"""}
    rows = list(get_task("code").heldout)[:1]
    report = audit_code_reward(rows, mode="none", limits=Limits(wall_seconds=5.0), probes=slow)
    assert report.failures() == ["write, then hang"], report.table()
    path = report.outcomes[0].example.removeprefix("wrote ")
    assert path.startswith(f"{where}/bomb-"), report.table()
    assert not os.path.exists(path)  # the audit removed it


def test_the_weak_guard_fails_the_audit():
    rows = list(get_task("code").heldout)[:1]
    assert "switching off an in-process guard" in audit_code_reward(rows, mode="weak").failures()


def test_forgeable_tests_are_counted_and_forged():
    rows = [{"tests": "expected = 3\nassert add(1, 2) == expected\nassert add(1, 2) == 3",
             "solution": "def add(a, b):\n    return a + b\n"}]
    report = audit_code_reward(rows, mode="strict")
    assert (report.tests, report.forgeable) == (2, 1)
    assert "verdict forging (harness nonce)" in report.failures()
    assert "forgeable tests (assert shapes the parent cannot check): 1 of 2" in report.table()


def test_check_reward_command_on_the_code_task(capsys, monkeypatch):
    monkeypatch.setattr(sandbox, "_mode", None)
    monkeypatch.delenv("GRPO_SANDBOX", raising=False)
    assert main(["check-reward", "--rewards", "code_tests", "--task", "code", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert f"exploits tried: {len(PROBES)} on every row; scoring or leaving a trace: 0" in out
    assert "gold solutions scoring the maximum: 2/2" in out


@pytest.mark.parametrize("mode", ["weak"])
def test_check_reward_exits_1_when_a_probe_gets_through(capsys, monkeypatch, mode):
    monkeypatch.setattr(sandbox, "_mode", None)
    monkeypatch.delenv("GRPO_SANDBOX", raising=False)
    assert main(["check-reward", "--rewards", "code_tests", "--task", "code", "--limit", "1", "--sandbox", mode]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_the_tests_on_disk_are_out_of_reach(tmp_path, monkeypatch):
    rows = list(get_task("code").heldout)[:1]
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    # the dataset in the trainer's working directory, where the probe looks first (/proc/*/cwd), so the
    # unsandboxed run finds it however much else /tmp holds
    monkeypatch.chdir(tmp_path)
    probes = {"the tests read from files on disk": PROBES["the tests read from files on disk"]}
    unhurried = Limits(wall_seconds=30.0)  # without a sandbox the search walks all of /tmp
    assert audit_code_reward(rows, mode="none", probes=probes, limits=unhurried).failures() == [
        "the tests read from files on disk"]
    assert audit_code_reward(rows, mode="strict", probes=probes).failures() == []
