"""pass@k and maj@k by hand, and the held-out evaluation on a tiny model."""

import json
import math

import pytest
import torch
from conftest import make_model, make_tokenizer

from grpo.config import ConfigError, TrainConfig
from grpo.sampling.evaluate import answer_key, evaluate, majority_at_k, pass_at_k


def what_eval_is_given(monkeypatch, argv: list[str], tokenizer, model=None) -> dict:
    """The arguments `grpo eval ARGV` hands to grpo.sampling.evaluate.evaluate, with the model's check and
    loading replaced by ``tokenizer`` and ``model`` (an Identity when None): what it would score, not the score."""
    import grpo.sampling.evaluate
    from grpo.cli import main

    seen = {}

    def evaluate(model, tokenizer, prompts, rows, reward, **kw):
        seen.update(prompts=prompts, rows=rows, **kw)
        raise SystemExit(0)

    policy = type("P", (), {"tokenizer": tokenizer, "model": torch.nn.Identity() if model is None else model})()
    monkeypatch.setattr(grpo.sampling.evaluate, "evaluate", evaluate)
    monkeypatch.setattr("grpo.models.check_model", lambda name: None)
    monkeypatch.setattr("grpo.models.load_policy", lambda name, device: policy)
    with pytest.raises(SystemExit):
        main(["eval", *argv])
    return seen


def test_pass_at_k_matches_the_binomial_formula():
    # n = 5, c = 2, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k = 1 is the fraction correct
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    for n, c, k in [(20, 7, 5), (16, 1, 8), (9, 0, 3)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # n - c < k: every draw of 4 holds the correct one
    # C(1000, 500) overflows a float; the product form does not
    value = pass_at_k(1000, 1, 500)
    assert value == pytest.approx(0.5)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="0 < k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_majority_at_k_votes_per_block():
    answers = ["46", "46", "45", "45", "45", "47"]
    correct = [True, True, False, False, False, False]
    # blocks of 3: [46, 46, 45] votes 46 (right), [45, 45, 47] votes 45 (wrong)
    assert majority_at_k(answers, correct, 3) == 0.5
    # one block of 6: 45 wins three to two
    assert majority_at_k(answers, correct, 6) == 0.0
    # k = 1 is the fraction correct
    assert majority_at_k(answers, correct, 1) == pytest.approx(2 / 6)
    # a tie goes to the answer seen first
    assert majority_at_k(["46", "45"], [True, False], 2) == 1.0


def test_answer_key_normalises_whitespace_and_a_period():
    assert answer_key("  46. ") == answer_key("46") == "46"
    assert answer_key("a  b\nc") == "a b c"


def test_evaluate_reports_greedy_pass_k_and_maj_k(tiny_model, tokenizer):
    from grpo.sampling.evaluate import encode_prompts

    rows = [{"prompt": f"q{i}", "answer": "a"} for i in range(6)]
    prompts = encode_prompts(tokenizer, [[{"role": "user", "content": r["prompt"]}] for r in rows])

    def has_a(text, row):
        return float("a" in text)

    result = evaluate(tiny_model, tokenizer, prompts, rows, has_a, max_new_tokens=4, batch_size=8,
                      samples=4, ks=(1, 2, 4))
    assert result.size == 6 and result.samples == 4
    assert set(result.metrics()) == {"heldout_accuracy", "heldout_pass@1", "heldout_pass@2", "heldout_pass@4",
                                     "heldout_maj@1", "heldout_maj@2", "heldout_maj@4"}
    assert result.pass_at[1] <= result.pass_at[2] <= result.pass_at[4]
    assert result.maj_at[1] == pytest.approx(result.pass_at[1])
    with pytest.raises(ValueError, match="each k must be in 1..samples"):
        evaluate(tiny_model, tokenizer, prompts, rows, has_a, max_new_tokens=4, samples=2, ks=(4,))


def test_cli_eval_rejects_k_above_samples(capsys):
    from grpo.cli import main

    assert main(["eval", "--samples", "2", "--k", "1", "4"]) == 2
    assert "--k must lie in 1..--samples (2)" in capsys.readouterr().err


@pytest.mark.parametrize("progress", [True, False])
def test_cli_eval_shows_progress_on_stderr_keeps_json_stdout_pure_and_takes_threads(capsys, monkeypatch, progress):
    """A line and a bar over its prompts on stderr while it runs (off with --no-progress); --json's stdout is
    the one JSON line; --threads reaches torch, as grpo train's does."""
    import torch

    from grpo.cli import main

    tokenizer = make_tokenizer()
    policy = type("P", (), {"tokenizer": tokenizer, "model": make_model(len(tokenizer), seed=3)})()
    monkeypatch.setattr("grpo.models.check_model", lambda name: None)
    monkeypatch.setattr("grpo.models.load_policy", lambda name, device: policy)
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    argv = ["eval", "--task", "add", "--eval-size", "4", "--samples", "2", "--k", "1", "2", "--max-new-tokens", "4",
            "--device", "cpu", "--threads", "3", "--json"]
    assert main(argv + ([] if progress else ["--no-progress"])) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and json.loads(out)["heldout_size"] == 4
    assert threads == [3]
    if progress:  # greedy then the samples: the bar counts each prompt once a pass
        assert "grpo eval: 4 held-out prompts, greedy then 2 samples each, at most 4 tokens" in err
        assert "8/8" in err, err
    else:
        assert err == ""


def test_config_rejects_eval_k_above_eval_samples():
    from grpo.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=r"eval_k must lie in 1..eval_samples \(2\)"):
        TrainConfig(eval_samples=2, eval_k=(1, 4))
    TrainConfig(eval_samples=0, eval_k=(1, 4))  # greedy only: k unused


def test_cli_eval_on_a_users_file_scores_the_split_training_held_out(tmp_path):
    """grpo eval --data FILE scores the prompts grpo train --data FILE kept out of training (not the
    file's first rows, which a run mostly trained on); --rows first scores a separate test file's head;
    a model saved by a run is scored at the run's token limit."""
    import json

    from grpo.cli import _eval_task, _run_token_limit, build_parser
    from grpo.tasks import load_task

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n"
                            for i in range(60)))
    args = build_parser().parse_args(["eval", "--data", str(data), "--eval-size", "8"])
    heldout = [r["prompt"] for r in _eval_task(args).heldout]
    trained = load_task("", data=str(data), heldout_size=8)
    assert heldout == [r["prompt"] for r in trained.heldout]
    assert not set(heldout) & {r["prompt"] for r in trained.train}
    assert heldout != [f"What is {i} + 2?" for i in range(8)]
    first = build_parser().parse_args(["eval", "--data", str(data), "--eval-size", "8", "--rows", "first"])
    assert [r["prompt"] for r in _eval_task(first).heldout] == [f"What is {i} + 2?" for i in range(8)]
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"max_new_tokens": 72}))
    assert _run_token_limit(str(run / "model")) == 72
    assert _run_token_limit(str(tmp_path)) == 0  # not a run's model folder
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["eval"]
    helps = {a.dest: a.help for a in sub._actions}
    assert "grpo train --data makes" in helps["data"] and "--rows" in helps["data"]  # --help says what is scored
    assert "the run's" in helps["task"] and "trained on" in helps["eval_size"]


EVAL_CASES = [  # (the run's config.json, what grpo eval is given, the rows it scores, whether they are the run's own)
    ({"task": "countdown", "eval_size": 64}, [], 64, True),
    ({"task": "countdown", "eval_size": 64}, ["--eval-size", "256"], 64, True),  # never wider than the run's split
    ({"task": "countdown", "eval_size": 64}, ["--eval-size", "16"], 16, True),
    ({"task": "add", "data": "rows.jsonl", "eval_size": 20, "rewards": ("r.py:score",), "reward_weights": (2.0,),
      "reward_style": "trl"}, [], 20, True),
    ({"task": "add", "data": "rows.jsonl", "eval_size": 20}, ["--data", "./rows.jsonl", "--eval-size", "50"], 20, True),
    ({"task": "countdown", "eval_data": "test.jsonl", "eval_size": 10}, [], 10, True),  # the task's checker and prompt
    ({"task": "countdown", "eval_size": 64}, ["--task", "add"], 256, False),
    ({}, [], 256, False),
]


@pytest.mark.parametrize("run, given, size, own", EVAL_CASES)
def test_grpo_eval_of_a_runs_model_scores_what_the_run_held_out_as_training_built_it(
        run, given, size, own, tmp_path, monkeypatch):
    """Without --task or --data, a run's model is scored on the run's own held-out rows, built as training built
    them (the task's checker and system prompt, the file's split, the --eval-data file's head), with its
    --rewards; a file named another way is the same file; another task is not the run's."""
    from grpo.cli import build_parser
    from grpo.cli.eval import _eval_config, _eval_reward, _eval_task, _inherit_source
    from grpo.sampling.prompts import run_task

    monkeypatch.chdir(tmp_path)
    for name, n in (("rows.jsonl", 120), ("test.jsonl", 30)):
        (tmp_path / name).write_text("".join(json.dumps({"prompt": f"What is {i} + {n}?", "answer": str(i + n)})
                                             + "\n" for i in range(n)))
    args = build_parser().parse_args(["eval", *given])
    _inherit_source(args, dict(run))
    task = _eval_task(args, _eval_config(args, dict(run)))
    assert len(task.heldout) == size and args.own == own
    if own:
        trained = run_task(TrainConfig(**run))
        assert [r["prompt"] for r in task.heldout] == [r["prompt"] for r in trained.heldout][:size]
        assert not {r["prompt"] for r in task.heldout} & {r["prompt"] for r in trained.train}
        assert (task.reward, task.system_prompt) == (trained.reward, trained.system_prompt)
        assert args.rewards == list(run.get("rewards", ()))
    if run.get("rewards"):
        assert (args.reward_weights, args.reward_style) == ([2.0], "trl")
        assert _eval_reward(args, task) is None  # answered rows: the run's held-out was its checker's, so is eval's
        assert args.rewards == []


def test_grpo_eval_refuses_a_run_that_held_out_nothing():
    from grpo.cli import build_parser
    from grpo.cli.eval import _inherit_source

    with pytest.raises(ConfigError, match="held out no prompts"):
        _inherit_source(build_parser().parse_args(["eval"]), {"task": "add", "eval_size": 0})


def test_cli_eval_of_a_runs_model_takes_the_runs_tools_and_turns(tmp_path, monkeypatch):
    """A run trained with its own tools or turn limits is scored with them, not with the task's."""
    import json

    import grpo.sampling.episodes
    from grpo.cli import main

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"max_new_tokens": 24, "tools": "none", "max_turns": 3,
                                                  "turn_discount": 0.5}))
    seen = {}

    def make_agent(config, task, tokenizer, **kw):
        seen.update(tools=config.tools, max_turns=config.max_turns, turn_discount=config.turn_discount,
                    max_new_tokens=config.max_new_tokens)
        raise SystemExit(0)

    monkeypatch.setattr(grpo.sampling.episodes, "make_agent", make_agent)
    monkeypatch.setattr("grpo.models.check_model", lambda name: None)
    tokenizer = make_tokenizer()
    monkeypatch.setattr("grpo.models.load_policy", lambda name, device: type("P", (), {"tokenizer": tokenizer})())
    monkeypatch.setattr("grpo.sampling.prompts.encode_prompts", lambda *a: [])
    try:
        main(["eval", "--model", str(run / "model"), "--task", "calc", "--eval-size", "4"])
    except SystemExit:
        pass
    assert seen == {"tools": "none", "max_turns": 3, "turn_discount": 0.5, "max_new_tokens": 24}


OTHER_TEMPLATE = (  # a chat template of the run's own, unlike the tokenizer's
    "{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant:\n{% endif %}"
)
RENDERINGS = {
    "chat": {"prompt_format": "chat"},
    "chat-template": {"prompt_format": "chat", "chat_template": "TEMPLATE", "few_shot": 2},
    "plain": {"prompt_format": "plain"},
    "r1-zero": {"prompt_format": "r1-zero"},
    "few-shot": {"prompt_format": "plain", "few_shot": 3},
}


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_grpo_eval_of_a_run_feeds_the_model_the_prompt_ids_training_fed(tmp_path, monkeypatch, rendering):
    """A run on a --data file with a system prompt, a prompt template and its format; grpo eval of its model on
    the same file, given none of them, renders each held-out row to the token ids the run's held-out
    evaluation fed the model (grpo/sampling/prompts.py, run_prompts)."""
    import json

    from tiny_run import tiny_config

    from grpo.run.build import resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 2", "answer": str(i + 2)}) + "\n" for i in range(40)))
    template = tmp_path / "template.jinja"
    template.write_text(OTHER_TEMPLATE)
    options = {k: str(template) if v == "TEMPLATE" else v for k, v in RENDERINGS[rendering].items()}
    config = tiny_config(data=str(data), eval_size=8, system_prompt="Be brief.", prompt_template="What is {question}?",
                         **options)
    setup_process(config)
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer))
    trainer = GRPOTrainer(resolve_run(config, model=model), model=model, tokenizer=tokenizer, progress=False)
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(trainer.config.to_dict()))
    seen = what_eval_is_given(monkeypatch, ["--model", str(run / "model"), "--data", str(data), "--eval-size", "8",
                                            "--samples", "0", "--device", "cpu"], tokenizer, trainer.model)
    assert [r["prompt"] for r in seen["rows"]] == [r["prompt"] for r in trainer.task.heldout]
    assert seen["prompts"] == trainer.heldout_prompts
    text = tokenizer.decode(seen["prompts"][0])
    assert "Be brief." in text and "What is" in text
    if "few_shot" in options:  # the run's worked examples, drawn from its training rows
        assert all(str(ex["answer"]) in text for ex in trainer.task.examples)


def test_grpo_eval_of_a_runs_model_runs_its_episodes_in_the_runs_chat_template(tmp_path, monkeypatch):
    import json


    template = tmp_path / "template.jinja"
    template.write_text(OTHER_TEMPLATE)
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"max_new_tokens": 24, "chat_template": str(template)}))
    seen = what_eval_is_given(monkeypatch, ["--model", str(run / "model"), "--task", "calc", "--eval-size", "4",
                                            "--samples", "0"], make_tokenizer())
    assert seen["agent"].prompt_format.template == OTHER_TEMPLATE  # the openings as training rendered them
    assert make_tokenizer().decode(seen["prompts"][0]).startswith("<|im_start|>system: ")


@pytest.mark.parametrize("size", ["0", "-3"])
def test_grpo_eval_refuses_a_non_positive_eval_size_before_loading_the_model(size, monkeypatch, capsys):
    # --eval-size 0 once fell back to 256 prompts in silence
    from grpo.cli import main

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("grpo.models.check_model", no_model)
    monkeypatch.setattr("grpo.models.load_policy", no_model)
    assert main(["eval", "--task", "add", "--eval-size", size, "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"grpo eval: error: --eval-size must be positive, got {size}"]


def test_grpo_eval_keeps_a_runs_rewards_on_rows_with_no_answer(tmp_path, monkeypatch):
    """Rows the checker cannot score (no answer field, a TRL-style run on prompts alone) keep the run's
    --rewards; one row without an answer among answered ones is enough."""
    from grpo.cli import build_parser
    from grpo.cli.eval import _eval_config, _eval_reward, _eval_task, _inherit_source

    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"Say {i}."} | ({"answer": str(i)} if i % 7 else {}) for i in range(60)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.py").write_text("def score(completion, example):\n    return 0.5\n")
    run = {"task": "add", "data": "rows.jsonl", "eval_size": 20, "rewards": ["r.py:score"]}
    args = build_parser().parse_args(["eval"])
    _inherit_source(args, dict(run))
    task = _eval_task(args, _eval_config(args, dict(run)))
    assert any("answer" not in r or r["answer"] is None for r in task.heldout)
    reward = _eval_reward(args, task)
    assert args.rewards == ["r.py:score"] and reward is not None
    assert reward("any", task.heldout[0]) == 0.5


def test_the_checker_scores_what_it_reads():
    """The held-out rows are the checker's to score (the alarms watch them; eval of a --rewards run scores them
    with it) when every row has the field it reads: the answer, or the code task's tests."""
    from grpo.rewards.math import math_answer
    from grpo.tasks import all_answered, get_task

    code = get_task("code")
    assert all_answered(code.heldout, code.reward) and not all_answered(code.heldout, math_answer)
    assert all_answered([{"answer": "3"}], math_answer) and not all_answered([{"answer": " "}, {"answer": "3"}])
    assert not all_answered([{"tests": ["assert f() == 1"]}], math_answer) and not all_answered([])


@pytest.mark.parametrize(("config", "metrics", "given", "expected"), [
    ({"max_new_tokens": 8}, [], [], 0.7),  # the run's temperature: TrainConfig's default, 0.7, in its config.json
    ({"max_new_tokens": 8, "temperature": 0.5}, [], [], 0.5),
    ({"max_new_tokens": 8, "temperature": 0.5}, [], ["--temperature", "1.0"], 1.0),  # given: it stands
    ({"max_new_tokens": 8, "temperature": 0.7, "temperature_target": 0.3},  # adapted: the last step's
     [{"step": 1, "temperature": 0.7}, {"step": 2, "temperature": 0.62}, {"heldout_accuracy": 0.5}], [], 0.62),
    (None, [], [], 1.0),  # a model no run saved
])
def test_grpo_eval_samples_a_runs_model_at_the_runs_temperature(tmp_path, monkeypatch, config, metrics, given,
                                                                 expected):
    """pass@k and maj@k of a run's model sample at the temperature the run sampled at (issue 52: they sampled
    at 1.0, not the run's 0.7), unless --temperature is given; a model no run saved samples at 1.0."""

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    if config is not None:
        full = {**TrainConfig().to_dict(), **config} if "temperature" not in config else config
        (run / "config.json").write_text(json.dumps(full))
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    seen = what_eval_is_given(monkeypatch, ["--model", str(run / "model"), "--task", "add", "--eval-size", "4",
                                            "--samples", "2", "--k", "1", "--max-new-tokens", "4", "--no-progress",
                                            *given], make_tokenizer())
    assert seen["temperature"] == pytest.approx(expected)


def test_grpo_eval_of_a_run_uses_the_format_its_model_files_settled(tmp_path, monkeypatch):
    """A run whose model folder has no chat template resolves to plain (source model) before anything loads;
    grpo eval of its model renders the run's plain prompts, with its stops, even with a tokenizer that has a
    chat template."""
    from tiny_run import tiny_config

    from grpo.run.build import resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer

    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    config = tiny_config(model=str(folder), task="add")
    setup_process(config)
    tokenizer = make_tokenizer()  # it has a chat template; the run's files said plain
    model = make_model(len(tokenizer))
    run = resolve_run(config, processes=1)
    trainer = GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)
    assert (trainer.config.prompt_format, trainer.sources["prompt_format"]) == ("plain", "model")
    saved = tmp_path / "run"
    (saved / "model").mkdir(parents=True)
    (saved / "config.json").write_text(json.dumps({**trainer.config.to_dict(), "sources": trainer.sources}))
    seen = what_eval_is_given(monkeypatch, ["--model", str(saved / "model"), "--task", "add", "--eval-size", "4",
                                            "--samples", "0", "--device", "cpu"], tokenizer, trainer.model)
    trainer.close()
    assert seen["prompts"] == trainer.heldout_prompts[:4] and seen["stop_strings"] == ("\n", "Question:")
    assert tokenizer.decode(seen["prompts"][0]).endswith("Answer:")
