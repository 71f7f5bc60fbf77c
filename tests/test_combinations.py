"""Combinations of options, pairwise: every pair of values of two axes below runs in at least one case
(tests/pairwise.py), each case 2 steps of ``grpo train`` on a tiny model folder, asserting what must hold
in every combination:

- every step's loss is finite;
- ``errored/reward`` counts the rows whose reward call failed, as ``reward_errors/<name>`` does;
- a run resumed from its step-1 checkpoint writes the straight run's metrics (bitwise, own engine; with vLLM,
  whose samples may wobble from run to run, the rows before the checkpoint kept, the same metrics logged,
  the resumed step trained with a finite loss, rewards logged and errors counted alike, on the same schedule);
- ``grpo eval`` of the saved model feeds it the held-out prompts training fed it (one process, own engine:
  recorded in this process);
- every model call keeps within the token budget, rows x tokens <= --micro-batch-tokens (same cases);
- a combination that is not built is refused in one line before any model loads (grpo/refusals.py).

Left out of the processes axis: two torchrun nodes of one process each (tests/test_distributed.py runs
that launch once; a third value would add cases this 2-core machine cannot afford in ``make test``).
``make combos`` runs the full product of the axes (COMBOS=product), outside CI.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
from conftest import make_model, make_tokenizer
from pairwise import all_pairs_of, pairwise, uncovered

from grpo.cli import main as cli_main
from grpo.refusals import ASYNC_TORCHRUN, ASYNC_VLLM_LORA, TURNS_NEED_CHAT

pytestmark = pytest.mark.combos

TESTS = Path(__file__).parent
ROOT = TESTS.parent
PLUGINS = TESTS / "combo_plugins.py"
BUDGET = 48  # a prompt is ~20 tokens, a group 2 x 4: sampling, the update and evaluation must split

AXES = {
    "engine": ("own", "vllm"),
    "adapter": ("none", "lora-rank", "folder"),
    "beta": (0.0, 0.04),
    "passes": ("1x1", "2x2"),
    "async_lag": (0, 1),
    "processes": (1, 2),
    "mask_truncated": (False, True),
    "format": ("chat", "plain", "r1-zero", "few-shot"),
    "task": ("single", "tools", "environment"),
    "reward": ("raises", "plain"),
}
REFUSED = (  # (what a case holds, the refusal's text)
    ({"async_lag": 1, "processes": 2}, ASYNC_TORCHRUN),
    ({"async_lag": 1, "engine": "vllm", "adapter": "lora-rank"}, ASYNC_VLLM_LORA),
    ({"async_lag": 1, "engine": "vllm", "adapter": "folder"}, ASYNC_VLLM_LORA),
    *(({"format": f, "task": t}, TURNS_NEED_CHAT) for f in ("plain", "r1-zero") for t in ("tools", "environment")),
)


def refusal(case) -> str | None:
    """The refusal a case's combination gets, or None when it is built."""
    return next((text for held, text in REFUSED if all(case.get(k) == v for k, v in held.items())), None)


def built(case) -> bool:
    return refusal(case) is None


def _cases() -> list[dict]:
    if os.environ.get("COMBOS") == "product":
        return [c for c in (dict(zip(AXES, values, strict=True)) for values in product(*AXES.values())) if built(c)]
    return pairwise(AXES, built)


CASES = _cases()


def _id(case) -> str:
    return "-".join(f"{v}" if not isinstance(v, bool) else (k if v else f"no_{k}") for k, v in case.items())


# ---- the generator


def test_every_pair_of_values_is_in_a_case_but_the_refused_ones():
    cases = pairwise(AXES, built)
    assert uncovered(cases, AXES, built) == []
    assert all(built(c) and set(c) == set(AXES) for c in cases)
    left_out = [p for p in all_pairs_of(AXES) if not built(dict(p))]
    assert ((("async_lag", 1), ("processes", 2)) in left_out
            and (("format", "plain"), ("task", "tools")) in left_out and len(left_out) == 5)
    assert len(cases) < len(list(product(*AXES.values()))) / 50


def test_pairwise_on_hand_checked_axes():
    axes = {"a": (0, 1), "b": (0, 1), "c": (0, 1)}
    cases = pairwise(axes)
    assert uncovered(cases, axes) == [] and len(cases) == 4  # 2 x 2 pairs of two axes need 4; 4 suffice for 3
    assert cases[0] == {"a": 0, "b": 0, "c": 0}
    assert pairwise(axes) == cases  # pure: the same cases every time
    missing = uncovered(cases[:-1], axes)
    assert missing and all(p not in set().union(*({tuple(sorted(c.items()))} for c in cases[:-1])) for p in missing)
    no_11 = pairwise(axes, lambda c: not (c.get("a") == 1 and c.get("b") == 1))
    assert all(not (c["a"] == 1 and c["b"] == 1) for c in no_11)
    assert uncovered(no_11, axes, lambda c: not (c.get("a") == 1 and c.get("b") == 1)) == []


def test_uncovered_names_the_missing_pairs():
    axes = {"a": (0, 1), "b": ("x", "y")}
    assert uncovered([{"a": 0, "b": "x"}, {"a": 1, "b": "y"}], axes) == [(("a", 0), ("b", "y")), (("a", 1), ("b", "x"))]


# ---- the runs


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A data file, and per engine the tiny model saved as a folder with a rank-4 adapter of it saved as a
    user brings one (vLLM's CPU attention takes head sizes of 32 and up: its model has 4 heads of 32)."""
    root = tmp_path_factory.mktemp("combos")
    for engine, hidden in (("own", 32), ("vllm", 128)):
        _save_model_and_adapter(root / engine, hidden)
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _save_model_and_adapter(where: Path, hidden: int) -> None:
    from peft import LoraConfig, get_peft_model

    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3, hidden=hidden)
    model.config.max_position_embeddings = 1024  # r1-zero's prompt is ~430 characters: vLLM checks this limit
    model.save_pretrained(where / "tiny")
    tokenizer.save_pretrained(where / "tiny")
    peft = get_peft_model(make_model(len(tokenizer), seed=3, hidden=hidden),
                          LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    peft.peft_config["default"].base_model_name_or_path = str(where / "tiny")
    peft.save_pretrained(where / "adapter")


def _vllm_python() -> str | None:
    own = ROOT / ".venv-vllm" / "bin" / "python"  # this checkout's (make vllm), else GRPO_VLLM_PYTHON's
    return str(own) if own.is_file() else os.environ.get("GRPO_VLLM_PYTHON") or None


def _args(case, folders: Path) -> list[str]:
    model = folders / case["engine"] / ("adapter" if case["adapter"] == "folder" else "tiny")
    fmt = {"chat": ["--prompt-format", "chat"], "plain": ["--prompt-format", "plain"],
           "r1-zero": ["--prompt-format", "r1-zero"], "few-shot": ["--prompt-format", "chat", "--few-shot", "2"]}
    task = {"single": [], "tools": ["--tools", f"{PLUGINS}:echo", "--max-turns", "2"],
            "environment": ["--env", f"{PLUGINS}:Count", "--max-turns", "2"]}
    reward = "odd_first_char_raises" if case["reward"] == "raises" else "first_char"
    epochs, minibatches = case["passes"].split("x")
    return ["--model", str(model), "--data", str(folders / "data.jsonl"), "--rewards", f"{PLUGINS}:{reward}",
            "--engine", case["engine"], "--lora-rank", "4" if case["adapter"] == "lora-rank" else "0",
            "--beta", str(case["beta"]), "--epochs", epochs, "--minibatches", minibatches,
            "--async-lag", str(case["async_lag"]), "--nproc", str(case["processes"]),
            *(["--mask-truncated"] if case["mask_truncated"] else []), *fmt[case["format"]], *task[case["task"]],
            "--no-preflight", "--steps", "2", "--save-every", "1", "--prompts-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "4", "--eval-size", "2", "--eval-every", "-1", "--micro-batch-tokens", str(BUDGET),
            "--device", "cpu", "--no-progress", "--sampler", "uniform", "--no-filter-groups", "--lr", "1e-2"]


def _in_process(case) -> bool:
    return case["engine"] == "own" and case["processes"] == 1


def _train(case, args: list[str]) -> None:
    if _in_process(case):
        assert cli_main(["train", *args]) == 0
        return
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}"}
    if case["engine"] == "vllm":
        env["GRPO_VLLM_PYTHON"] = _vllm_python()
    proc = subprocess.run([sys.executable, "-m", "grpo", "train", *args], env=env, capture_output=True,
                          text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]


TIMING = ("time", "seconds", "tokens_per_second")


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture
def budget_calls(monkeypatch):
    """(rows, tokens) of every call of a Llama decoder in this process from now on."""
    from transformers.models.llama.modeling_llama import LlamaModel

    calls: list[tuple[int, int]] = []
    own = LlamaModel.forward

    def forward(self, *args, **kwargs):
        fed = kwargs.get("input_ids")
        fed = kwargs.get("inputs_embeds") if fed is None else fed
        if fed is None and args:
            fed = args[0]
        calls.append((fed.shape[0], fed.shape[1]))
        return own(self, *args, **kwargs)

    monkeypatch.setattr(LlamaModel, "forward", forward)
    return calls


@pytest.fixture
def eval_prompts(monkeypatch):
    """The prompts every evaluation in this process feeds the model (training's held-out and ``grpo eval``)."""
    import grpo.observe.heldout
    import grpo.sampling.evaluate

    seen: list[list[list[int]]] = []
    own = grpo.sampling.evaluate.evaluate

    def evaluate(model, tokenizer, prompts, rows, reward, **kw):
        seen.append([list(p) for p in prompts])
        return own(model, tokenizer, prompts, rows, reward, **kw)

    monkeypatch.setattr(grpo.sampling.evaluate, "evaluate", evaluate)
    monkeypatch.setattr(grpo.observe.heldout, "evaluate", evaluate)
    return seen


def _run_case(case):
    return pytest.param(case, id=_id(case))


def _refused_case(held, text):
    return pytest.param(held, text, id="-".join(str(v) for v in held.values()))


@pytest.mark.parametrize("case", [_run_case(c) for c in CASES])
def test_a_combination_trains_resumes_and_evaluates_as_every_other(case, folders, tmp_path, budget_calls,
                                                                    eval_prompts):
    if case["engine"] == "vllm" and _vllm_python() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: no .venv-vllm (make vllm), so the vLLM combinations cannot run")
        pytest.skip("no .venv-vllm in this checkout and no GRPO_VLLM_PYTHON: make vllm builds it")
    args = _args(case, folders)
    straight, split = tmp_path / "straight", tmp_path / "split"
    _train(case, [*args, "--output", str(straight)])
    trained = [r for r in _metrics(straight) if "loss" in r]
    assert len(trained) == 2 and all(math.isfinite(r["loss"]) for r in trained)
    name = "odd_first_char_raises" if case["reward"] == "raises" else "first_char"
    assert all(r["errored/reward"] == r[f"reward_errors/{name}"] for r in trained)
    if case["reward"] == "plain":
        assert all(r["errored/reward"] == 0 for r in trained)
    if _in_process(case):
        assert budget_calls and [(n, t) for n, t in budget_calls if n > 1 and n * t > BUDGET] == []
        _eval_renders_the_trained_prompts(straight, folders, eval_prompts)
    shutil.copytree(straight, split, ignore=shutil.ignore_patterns("step-00000002"))
    # resumed on as many processes as it ran on: bitwise is the promise for the same world size (on another,
    # sums across ranks come in another order: a loss of 3e-8 against 0.0 seen)
    _train(case, ["--resume", str(split), "--steps", "2", "--nproc", str(case["processes"]), "--no-progress"])
    ours, theirs = _metrics(split), _metrics(straight)
    if case["engine"] == "own":
        assert ours == theirs
    else:
        _resumed_as_vllm_promises(ours, theirs, name)


# a step's metrics that do not depend on what was sampled: the same after a resume whatever the engine
UNSAMPLED = ("step", "lr", "optimizer_steps", "gen_rounds", "generated_groups")


def _resumed_as_vllm_promises(ours: list[dict], theirs: list[dict], reward: str) -> None:
    """What a vLLM run resumed from its step-1 checkpoint promises, where its samples may differ from the
    straight run's by vLLM's run-to-run wobble: the rows logged before the checkpoint kept as they were (the
    logs cut back to it), the same metrics logged at every step, the resumed step trained (a finite loss,
    rewards logged, errored rows counted alike) on the same schedule."""
    assert [r["step"] for r in ours] == [r["step"] for r in theirs]
    assert ours[:2] == theirs[:2]  # the step-0 evaluation and step 1, from before the checkpoint
    assert [sorted(r) for r in ours] == [sorted(r) for r in theirs]
    resumed = [r for r in ours[2:] if "loss" in r]
    assert len(resumed) == 1 and math.isfinite(resumed[0]["loss"])
    row, straight_row = resumed[0], next(r for r in theirs[2:] if "loss" in r)
    assert row["errored/reward"] == row[f"reward_errors/{reward}"]
    # a mean over no verdict (every row errored: a cut row under --mask-truncated is one) is logged as null
    logged = [row[k] for k in ("reward_mean", f"reward/{reward}")]
    assert all(v is not None and math.isfinite(v) for v in logged) or row["errored_frac"] == 1, row
    assert {k: row[k] for k in UNSAMPLED} == {k: straight_row[k] for k in UNSAMPLED}
    assert math.isfinite(row["sampler_kl"])  # the engine's log-probs, after the resume's push, still compared


def _eval_renders_the_trained_prompts(run: Path, folders: Path, seen: list) -> None:
    trained = list(seen)
    assert cli_main(["eval", "--model", str(run / "model"), "--data", str(folders / "data.jsonl"), "--eval-size", "2",
                     "--samples", "0", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert seen[-1] == trained[0]  # the step-0 held-out evaluation's (the one after it: the training prompts')


@pytest.mark.parametrize("held, text", [*(_refused_case(h, t) for h, t in REFUSED),
                                       _refused_case({"format": "r1-zero", "task": "environment", "processes": 2},
                                                     TURNS_NEED_CHAT)])
def test_a_combination_not_built_is_refused_in_one_line_before_anything_loads(held, text, folders, monkeypatch,
                                                                              capsys):
    def must_not_load(*a, **kw):
        raise AssertionError("a model loaded before the refusal")

    # grpo.run.trainer first: importing it after grpo.models is patched would keep the patch past this test
    monkeypatch.setattr("grpo.run.build.load_policy", must_not_load)
    monkeypatch.setattr("grpo.models.load_policy", must_not_load)
    case = {**CASES[0], "engine": "own", "processes": 1, **held}
    rc = cli_main(["train", *_args(case, folders), "--output", str(folders / "refused")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and err.count("\n") == 0 and text.format(fmt=held.get("format")) in err and "Traceback" not in err
    assert not (folders / "refused").exists()
