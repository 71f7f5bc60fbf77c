"""Held-out means held out: a dataset's configurations and splits (a saved DatasetDict, a folder of split files,
a hub-style folder with two configurations), the overlap between training and held-out prompts found and
removed, and `grpo data`. Fixtures are built here; nothing reads shared/ or a hub."""

import json
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.tasks import DataError, load_rows, load_task, split_rows

QUICK = ["--steps", "1", "--eval-subset", "0", "--prompts-per-step", "2", "--group-size", "2",
         "--max-gen-rounds", "1", "--preflight-prompts", "2", "--preflight", "warn", "--max-new-tokens", "4",
         "--reward-workers", "0", "--threads", "1", "--device", "cpu", "--no-progress", "--no-save-model"]


def rows(prefix: str, n: int, start: int = 0) -> list[dict]:
    return [{"question": f"{prefix} {i} + 1?", "answer": str(i + 1)} for i in range(start, start + n)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def prompts(task_rows) -> list[str]:
    return [r["prompt"] for r in task_rows]


def questions(records: list[dict]) -> list[str]:
    return [r["question"] for r in records]


@pytest.fixture
def split_folder(tmp_path) -> Path:
    """A folder of split files: train.jsonl, validation.jsonl and test.csv."""
    folder = tmp_path / "splits"
    write_jsonl(folder / "train.jsonl", rows("train", 12))
    write_jsonl(folder / "validation.jsonl", rows("validation", 4))
    (folder / "test.csv").write_text("question,answer\n" + "".join(f"test {i} + 1?,{i + 1}\n" for i in range(5)))
    return folder


@pytest.fixture
def hub_folder(tmp_path) -> Path:
    """A folder laid out as a hub dataset: README.md's YAML header declares two configurations."""
    folder = tmp_path / "hub"
    write_jsonl(folder / "main" / "train.jsonl", rows("main", 10))
    write_jsonl(folder / "main" / "test.jsonl", rows("main test", 3))
    write_jsonl(folder / "socratic" / "train-00000.jsonl", rows("socratic", 6))
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n"
        "  - split: test\n    path: main/test.jsonl\n- config_name: socratic\n  data_files: socratic/train-*.jsonl\n"
        "---\n# A two-configuration dataset\n")
    return folder


def test_a_saved_datasetdict_trains_on_train_and_holds_out_test(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows("train", 8)),
                          "test": datasets.Dataset.from_list(rows("test", 3))}).save_to_disk(str(tmp_path / "dd"))
    task = load_task("", data=str(tmp_path / "dd"))
    assert prompts(task.train) == questions(rows("train", 8)) and prompts(task.heldout) == questions(rows("test", 3))
    assert (task.data["split"], task.data["eval_split"], task.data["overlap_removed"]) == ("train", "test", 0)
    assert task.defaults["data_split"] == "train" and task.defaults["eval_split"] == "test"  # config.json's


def test_a_folder_of_split_files_holds_out_test_unless_a_split_is_named(split_folder):
    task = load_task("", data=str(split_folder), heldout_size=3)
    assert prompts(task.train) == questions(rows("train", 12))
    assert prompts(task.heldout) == questions(rows("test", 3))  # test.csv's first 3 rows
    assert task.data["rows"] == 12 and task.data["heldout_rows"] == 3
    task = load_task("", data=str(split_folder), eval_split="validation")
    assert prompts(task.heldout) == questions(rows("validation", 4))
    task = load_task("", data=str(split_folder), data_split="validation")  # trains on validation, holds out test
    assert prompts(task.train) == questions(rows("validation", 4)) and len(task.heldout) == 5
    task = load_task("", data=str(split_folder), eval_split="train", heldout_size=4)  # a split of train itself
    assert len(task.train) == 8 and len(task.heldout) == 4 and task.data["heldout_split_off"]
    assert set(prompts(task.train)) | set(prompts(task.heldout)) == set(questions(rows("train", 12)))
    with pytest.raises(DataError, match=r"has no split 'dev' \(it has test, train, validation\)"):
        load_task("", data=str(split_folder), data_split="dev")


def test_two_configurations_none_named_are_refused_in_one_line_naming_both(hub_folder, capsys):
    assert main(["train", "--data", str(hub_folder), "--output", str(hub_folder / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has configurations main, socratic: name one with --data-config" in err
    assert not (hub_folder / "run").exists()
    task = load_task("", data=str(hub_folder), data_config="main")
    assert prompts(task.train) == questions(rows("main", 10)) and prompts(task.heldout) == questions(rows("main test", 3))
    socratic = load_task("", data=str(hub_folder), data_config="socratic", heldout_size=2)  # train only: split off
    assert len(socratic.train) == 4 and len(socratic.heldout) == 2 and socratic.data["config"] == "socratic"
    with pytest.raises(DataError, match=r"has no configuration 'x' \(it has main, socratic\)"):
        load_task("", data=str(hub_folder), data_config="x")


def test_the_hub_style_folder_reads_as_datasets_reads_it(hub_folder):
    """Our reader of a README's configs and `datasets.load_dataset(folder, name)` agree on every split."""
    import datasets

    for name in ("main", "socratic"):
        theirs = datasets.load_dataset(str(hub_folder), name)
        from grpo.tasks.sources import open_source

        ours = open_source(str(hub_folder), name)
        assert list(ours.splits) == list(theirs)
        for split in theirs:
            assert [r for _, r in ours.records(split)] == list(theirs[split])


def test_eval_data_sharing_a_tenth_of_its_prompts_is_removed_from_training(tmp_path):
    """Held-out: 20 prompts, 2 of them training prompts with their case and spacing changed: those two leave
    training, counted; the held-out set is the file as given."""
    train = write_jsonl(tmp_path / "train.jsonl", rows("What is", 100))
    shared = [{"question": "  WHAT IS   3 + 1? ", "answer": "4"}, {"question": "what is 70 +\t1?", "answer": "71"}]
    given = [*rows("How much is", 18), *shared]
    test = write_jsonl(tmp_path / "test.jsonl", given)
    task = load_task("", data=str(train), eval_data=str(test), heldout_size=50)
    assert [r["prompt"] for r in task.heldout] == [r["question"] for r in given]  # unchanged
    assert len(task.train) == 98 and task.data["overlap_removed"] == 2
    assert {"What is 3 + 1?", "What is 70 + 1?"}.isdisjoint(prompts(task.train))


def test_duplicates_inside_one_file_never_cross_the_split(tmp_path):
    """A file holding 2 of its 20 held-out prompts a second time (case and spacing changed), and one training
    prompt twice: the held-out set is the one the file without copies gives, the copies of held-out prompts
    leave training (counted as overlap), the training duplicate is counted."""
    from grpo.tasks.data import prompt_key

    base = rows("What is", 100)
    _, held = split_rows(load_rows(str(write_jsonl(tmp_path / "base.jsonl", base))), 20)
    trained = next(r for r in base if r["question"] not in prompts(held))
    copies = [{"question": f"  {r['question'].upper()} ", "answer": r["answer"]} for r in held[:2]]
    path = write_jsonl(tmp_path / "dups.jsonl", [*base, *copies, trained])
    task = load_task("", data=str(path), heldout_size=20)
    assert prompts(task.heldout) == prompts(held)
    assert not {prompt_key(r) for r in task.train} & {prompt_key(r) for r in task.heldout}
    assert task.data["overlap_removed"] == 2 and task.data["duplicates"] == 1 and len(task.train) == 81


def test_split_options_are_refused_without_data(capsys):
    assert main(["train", "--data-split", "train", "--output", "/nonexistent/x"]) == 2
    assert capsys.readouterr().err == "grpo train: error: data_split names a part of a dataset, and no data is given\n"
    with pytest.raises(DataError, match="eval_split names a part of a dataset, and no eval_data is given"):
        load_task("add", eval_split="test")


@pytest.mark.model
def test_a_run_says_and_records_the_splits_and_the_overlap_removed(tmp_path, tiny_model_folder, capsys):
    folder = tmp_path / "data"
    write_jsonl(folder / "train.jsonl", rows("What is", 30))
    write_jsonl(folder / "test.jsonl", [*rows("How much is", 9), {"question": "WHAT  is 4 + 1?", "answer": "5"}])
    run = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--model", str(tiny_model_folder), "--output", str(run), "--eval-size", "4",
                 *QUICK]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"data: {folder} split train, 30 rows; held out: {folder} split test, first 4 rows"
    assert lines[1].startswith("data: 1 training rows removed, their prompt being held out")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data"]["overlap_removed"] == 1 and summary["data"]["train_rows"] == 29
    assert json.loads((run / "preflight.json").read_text())["data"]["overlap_removed"] == 1
    config = json.loads((run / "config.json").read_text())
    assert (config["data_split"], config["eval_split"], config["data_config"]) == ("train", "test", "")


@pytest.mark.model
def test_grpo_train_in_python_says_the_same_data_lines_as_the_command(tmp_path, tiny_model_folder, capsys):
    # issue 54: grpo.train(TrainConfig(data=...)) read the splits and removed the overlap without a word
    import grpo
    from grpo.config import TrainConfig

    folder = tmp_path / "data"
    write_jsonl(folder / "train.jsonl", rows("What is", 30))
    write_jsonl(folder / "test.jsonl", [*rows("How much is", 9), {"question": "WHAT  is 4 + 1?", "answer": "5"}])
    assert main(["train", "--data", str(folder), "--model", str(tiny_model_folder), "--output", str(tmp_path / "cli"),
                 "--eval-size", "4", *QUICK]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data: ")]
    grpo.train(TrainConfig(data=str(folder), model=str(tiny_model_folder), eval_size=4, steps=1, eval_subset=0,
                           prompts_per_step=2, group_size=2, max_gen_rounds=1, preflight_prompts=2, preflight="warn",
                           max_new_tokens=4, reward_workers=0, threads=1, device="cpu", save_model=False),
               run_dir=tmp_path / "api", progress=False)
    said = [said, [line for line in capsys.readouterr().out.splitlines() if line.startswith("data: ")]]
    assert said[0] == said[1] and len(said[0]) == 2
    assert said[1][0] == f"data: {folder} split train, 30 rows; held out: {folder} split test, first 4 rows"


@pytest.mark.model
def test_a_run_on_a_file_with_copies_of_held_out_prompts_counts_them(tmp_path, tiny_model_folder, capsys):
    """One file, 20 distinct prompts, 2 of the 10 held out written twice more (case and spacing changed): the
    copies leave training, summary.json counts them, the run says so."""
    from grpo.tasks import load_rows

    base = rows("What is", 20)
    _, held = split_rows(load_rows(str(write_jsonl(tmp_path / "base.jsonl", base))), 10)
    copies = [{"question": f" {r['question'].lower()}  ", "answer": r["answer"]} for r in held[:2]]
    data = write_jsonl(tmp_path / "dups.jsonl", [*base, *copies])
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--model", str(tiny_model_folder), "--output", str(run), "--eval-size", "10",
                 *QUICK]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"data: {data} split train, 22 rows; held out: 10 of its prompts, split off (never trained on)"
    assert lines[1].startswith("data: 2 training rows removed")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data"]["overlap_removed"] == 2 and summary["heldout_size"] == 10
    assert json.loads((run / "config.json").read_text())["eval_split"] == "train"


@pytest.mark.model
def test_eval_and_check_reward_read_the_same_configurations_and_splits(hub_folder, split_folder, capsys):
    from grpo.cli import _eval_task, build_parser
    from grpo.cli.eval import _inherit_source

    def held(*argv):
        args = build_parser().parse_args(["eval", *argv])
        _inherit_source(args, {})
        return prompts(_eval_task(args).heldout)

    assert held("--data", str(split_folder), "--eval-size", "3") == questions(rows("test", 3))
    assert held("--data", str(split_folder), "--eval-split", "validation") == questions(rows("validation", 4))
    assert held("--data", str(hub_folder), "--data-config", "main") == questions(rows("main test", 3))
    assert held("--data", str(split_folder), "--rows", "first", "--eval-size", "2") == questions(rows("test", 2))
    assert main(["check-reward", "--reward", "math_answer", "--data", str(hub_folder), "--data-config", "socratic"]) == 0
    assert "plain                       gold           6" in capsys.readouterr().out
    assert main(["check-reward", "--reward", "math_answer", "--data", str(hub_folder)]) == 2
    assert "has configurations main, socratic" in capsys.readouterr().err


@pytest.mark.model
def test_grpo_data_shows_splits_prompts_answers_and_the_gold_audit(tmp_path, tiny_model_folder, capsys):
    folder = tmp_path / "gsm"
    write_jsonl(folder / "train.jsonl", [{"question": "Ann has 3 apples and buys 4. How many?",
                                          "answer": "3 + 4 = 7\n#### 7"}, *rows("What is", 5)])
    write_jsonl(folder / "test.jsonl", [{"question": "what is  0 + 1?", "answer": "1"}, *rows("How much is", 2)])
    assert main(["data", "--data", str(folder), "--model", str(tiny_model_folder)]) == 0
    out = capsys.readouterr().out
    assert f"data: {folder} split train, 6 rows; held out: {folder} split test, first 3 rows" in out
    assert "data: 1 training rows removed" in out and "test 3, train 6 rows" in out
    assert "fields: question, answer; prompt from 'question', answer from 'answer'" in out
    assert out.count("as the model sees it:") == 2 and "Ann has 3 apples" in out and "What is 1 + 1?" in out
    assert "answer '7' parsed from '3 + 4 = 7 #### 7'" in out
    assert "gold forms scoring the maximum: 20/20 (100.00%)" in out and "exploit" not in out


def test_a_configuration_of_the_training_data_is_not_asked_of_another_held_out_file(hub_folder, tmp_path):
    """--data-config names the training source's configuration: a separate one-file --eval-data has none, and
    is read as it is."""
    test = write_jsonl(tmp_path / "test.jsonl", rows("held", 4))
    task = load_task("", data=str(hub_folder), data_config="main", eval_data=str(test))
    assert prompts(task.train) == questions(rows("main", 10)) and prompts(task.heldout) == questions(rows("held", 4))
