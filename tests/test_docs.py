"""The docs say what the code does: every `grpo` command in a shell code block of README.md and docs/*.md
parses with `grpo`'s own parser, and a train or preflight command also builds its TrainConfig (so an invalid
value fails); a `grpo train` or `torchrun ... -m grpo train` line passes every check grpo train makes before a
weight loads (the memory check aside), for the processes it runs; those this machine can run (no GPU, vLLM, hub download or file of the reader's own) run; every
`make` target named exists; every option, metric or alarm named in backticks exists in the code; every
relative link resolves, and README links every page of docs/.

Pages are found at run time (docs/*.md), so a page added later is checked the same way. Commands run in this
process on a tiny random model, with small overrides for the options the command does not name itself (one
step, a few held-out prompts, a fresh output folder) that keep the layer to a few minutes; a command whose
documented outcome is a refusal (EXPECTED) runs as written and must give that outcome. `python examples/...`
runs the embedded model (slow).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
# an example run in a bare environment keeps the one torch thread a pytest worker gives its processes
# (tests/conftest.py): two threads each on two busy cores wait on each other
ONE_THREAD = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]} if "OMP_NUM_THREADS" in os.environ else {}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
SHELL = ("", "bash", "sh", "shell", "console")  # a code block in these is typed; text, python, yaml are not
PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>")
SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# backticked snake_case words that name something outside this package
NOT_OURS = {"reward_len"}  # TRL's quick-start reward function, quoted from its docs
RUN_COMMANDS = ("train", "preflight", "eval", "report", "tasks", "check-reward", "data")
NEEDS_MORE = ("--engine", "--nproc", "--fsdp", "--device", "--async-lag", "--config", "--help")  # GPU, vLLM, ...
PATH_OPTIONS = ("--data", "--eval-data", "--model", "--teacher", "--chat-template")
CODE_OPTIONS = ("--rewards", "--reward", "--tools", "--env")  # file.py:name, or a built-in name


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path) -> list[str]:
    """The page's shell code blocks (output shown as ```text is not a command)."""
    return [body for lang, body in FENCE.findall(page.read_text(encoding="utf-8")) if lang.strip() in SHELL]


def prose(page: Path) -> str:
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def commands(page: Path) -> list[list[str]]:
    """The shell commands of a page's code blocks that are grpo's, python scripts', torchrun's or make's, as
    argv lists: continuation lines joined, comments and a leading '$ ' dropped, <placeholders> kept as one word."""
    found = []
    for block in blocks(page):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if not line.startswith(("grpo ", "python ", "torchrun ", "make")):
                continue
            for part in line.split("&&"):
                words = shlex.split(PLACEHOLDER.sub(lambda m: m.group(0).replace(" ", "_"), part), comments=True)
                if words:
                    found.append(words)
    return found


def grpo_argv(words: list[str]) -> list[str] | None:
    """The arguments `grpo` gets: after `grpo`, or after `-m grpo` in a torchrun line; None for other tools."""
    if words[0] == "grpo":
        return words[1:]
    if words[0] == "torchrun" and "-m" in words and words[words.index("-m") + 1] == "grpo":
        return words[words.index("-m") + 2:]
    return None


ALL_COMMANDS = [(page_name(p), words) for p in PAGES for words in commands(p)]
GRPO_COMMANDS = [(name, argv) for name, words in ALL_COMMANDS if (argv := grpo_argv(words)) is not None]
TYPED = [(name, words[1:]) for name, words in ALL_COMMANDS if words[0] == "grpo"]  # torchrun's lines need torchrun


def option_strings() -> set[str]:
    """Every option of every grpo subcommand."""
    import argparse

    from grpo.cli.parser import build_parser

    parser = build_parser()
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= set(sub._option_string_actions)
    return found


def source_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "grpo").rglob("*.py")))


def test_the_pages_have_commands_and_the_readme_stays_short():
    assert ROOT / "docs" / "alarms.md" in PAGES
    assert len(GRPO_COMMANDS) >= 30, GRPO_COMMANDS
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; a newcomer's first five minutes fit in 200"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in readme.split("grpo tasks")[0]  # said before the first grpo command


@pytest.mark.parametrize(("page", "argv"), GRPO_COMMANDS, ids=[f"{p}: grpo {' '.join(a)[:60]}" for p, a in GRPO_COMMANDS])
def test_every_grpo_command_in_the_docs_parses(page, argv, monkeypatch):
    from grpo.cli.parser import build_parser

    if "--help" in argv:
        with pytest.raises(SystemExit) as stopped:
            build_parser().parse_args(argv)
        assert stopped.value.code == 0
        return
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as err:
        raise AssertionError(f"{page}: `grpo {' '.join(argv)}` does not parse") from err
    if argv[0] in ("train", "preflight") and not getattr(args, "resume", None) and (
            not args.config or (ROOT / args.config).is_file()):
        from grpo.cli.train import _config_from_args
        from grpo.config import ConfigError

        monkeypatch.chdir(ROOT)  # a --config file is the repository's
        try:
            _config_from_args(args)  # as `grpo train` builds its config: choices and ranges checked
        except ConfigError as err:
            raise AssertionError(f"{page}: `grpo {' '.join(argv)}`: {err}") from err


def processes(words: list[str]) -> int:
    """The processes a documented line runs: `grpo train --nproc N`'s N, torchrun's --nproc-per-node times
    --nnodes (an elastic range MIN:MAX counts its MAX)."""
    def value(names: tuple[str, ...], default: str) -> str:
        for i, word in enumerate(words):
            name, _, attached = word.partition("=")
            if name in names:
                return attached or words[i + 1]
        return default

    if words[0] == "torchrun":
        per_node = value(("--nproc-per-node", "--nproc_per_node"), "1")
        return int(per_node) * int(value(("--nnodes",), "1").split(":")[-1])
    return int(value(("--nproc",), "1"))


def readers_own(value: str) -> bool:
    """A file the docs' reader brings (or a hub dataset this machine cannot reach): not in the repository."""
    return not (ROOT / value.split(":")[0]).exists()


STYLE_STAND_INS = {  # a reward of each calling style, standing in for a reward file of the reader's own
    "trl": lambda completions, **kwargs: [0.0] * len(completions),
    "verl": lambda data_source, solution_str, ground_truth, extra_info=None: 0.0,
}


def stand_in_readers_files(monkeypatch, style: str) -> None:
    """The pre-load checks as written, with the built-in task in place of a data set and a reward of the
    command's style in place of a reward file that the docs' reader brings (their contents are the reader's;
    what is checked here is the command's options, their combinations and the number of processes)."""
    import grpo.run.build as setup

    config_task, resolve_reward = setup.config_task, setup.resolve_reward

    def task(config, **kw):
        if (config.data and readers_own(config.data)) or (config.eval_data and readers_own(config.eval_data)):
            config = dataclasses.replace(config, data="", eval_data="", prompt_field="", answer_field="",
                                         prompt_template="")
        return config_task(config, **kw)

    def reward(name):
        if isinstance(name, str) and ".py:" in name and readers_own(name):
            return STYLE_STAND_INS.get(style, lambda completion, example: 0.0)
        return resolve_reward(name)

    monkeypatch.setattr(setup, "config_task", task)
    monkeypatch.setattr(setup, "resolve_reward", reward)


TRAIN_LINES = [(name, words) for name, words in ALL_COMMANDS if (argv := grpo_argv(words)) and argv[0] == "train"
               and "--help" not in argv and "--resume" not in argv]


@pytest.mark.parametrize(("page", "words"), TRAIN_LINES, ids=[f"{p}: {' '.join(w)[:70]}" for p, w in TRAIN_LINES])
def test_every_train_line_in_the_docs_passes_the_checks_a_run_makes_before_loading(page, words, monkeypatch):
    """Each `grpo train` and `torchrun ... -m grpo train` line goes through what `grpo train` checks before a
    weight loads (grpo.cli.train.run_from_args: the config, the task and rewards, the combinations not built,
    prompts per step over the processes, the output folder), for the processes the line runs. The memory check
    is left out: it reads this machine's memory, not the line's. A --config file of the reader's own (shown in
    the page) is not read."""
    from grpo.cli.parser import build_parser
    from grpo.cli.train import run_from_args

    argv = grpo_argv(words)
    if any("runs/<run>" in word for word in argv):  # a run of the reader's own: checked where it runs, on a run
        pytest.skip("names a run of the reader's own (test_every_grpo_command_this_machine_can_run_runs runs it)")
    args = build_parser().parse_args(argv)
    if args.config and readers_own(args.config):
        pytest.skip(f"{args.config} is the reader's own file")
    monkeypatch.chdir(ROOT)
    stand_in_readers_files(monkeypatch, args.reward_style or "auto")
    refused = EXPECTED.get(tuple(argv))  # a line the page shows refused: refused here too, with its line
    if refused and refused[1].startswith("grpo train: error: not enough memory"):
        pytest.skip("refused by the memory check, which this test leaves out")
    try:
        run_from_args(args, processes(words))
    except (ValueError, OSError, RuntimeError) as err:  # ConfigError, DataError, RewardError, ModelError, EngineError
        if refused and str(err).startswith(refused[1].removeprefix("grpo train: error: ")):
            return
        raise AssertionError(f"{page}: `{' '.join(words)}` on {processes(words)} processes: {err}") from err
    assert not refused, f"{page}: `{' '.join(words)}` is shown refused but passed the checks before loading"


def test_the_pre_load_check_counts_a_lines_processes():
    """The check above sees torchrun's processes: the two-node line of 8 processes each is 16."""
    assert processes(["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "-m", "grpo", "train"]) == 16
    assert processes(["torchrun", "--nnodes=1:2", "--nproc_per_node=4", "-m", "grpo", "train"]) == 8
    assert processes(["grpo", "train", "--nproc", "4"]) == 4
    assert processes(["grpo", "train"]) == 1
    from grpo.cli.parser import build_parser
    from grpo.cli.train import run_from_args
    from grpo.config import ConfigError

    with pytest.raises(ConfigError, match="divisible by the number of processes"):
        run_from_args(build_parser().parse_args(["train", "--task", "add", "--prompts-per-step", "8"]), 16)


LINK = re.compile(r"\]\(([^()\s]+)\)")


def test_every_relative_link_resolves_and_readme_links_every_page():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page)):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page_name(page)}: {target}")
    assert not broken, "links to nothing: " + ", ".join(broken)
    linked = set(LINK.findall(prose(ROOT / "README.md")))
    unlinked = [page_name(p) for p in PAGES[1:] if page_name(p) not in {t.split("#")[0] for t in linked}]
    assert not unlinked, "pages README.md does not link: " + ", ".join(unlinked)


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def test_every_make_target_and_script_named_exists():
    targets = makefile_targets()
    spans = [s.split() for p in PAGES for s in re.findall(r"`([^`\n]+)`", prose(p))]
    named = [words for _, words in ALL_COMMANDS] + [w for w in spans if w and w[0] in ("make", "python")]
    for words in named:
        if words[0] == "make":
            wanted = [w for w in words[1:] if "=" not in w][:1]
            assert all(w in targets for w in wanted), f"`{' '.join(words)}`: no such make target"
        elif words[0] == "python" and words[1:] and words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), f"`{' '.join(words)}`: no such script"


def test_every_backticked_option_metric_and_alarm_exists():
    options, source = option_strings(), source_text()
    stale = []
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", prose(page)):
            if span.split()[0] in ("torchrun", "pip", "python", "make", "apt-get"):
                continue  # another tool's options (scripts are checked above)
            stale += [f"{page_name(page)}: {o}" for o in OPTION.findall(span) if o not in options]
            if SNAKE.fullmatch(span) and span not in NOT_OURS and not re.search(rf"\b{span}\b", source):
                stale.append(f"{page_name(page)}: {span}")
    assert not stale, "names in the docs that the code does not have: " + ", ".join(stale)


# ---- running the commands that this machine can run ----

def runnable(argv: list[str]) -> bool:
    """A command runs when it needs nothing this machine lacks: no GPU, vLLM or second process, and every file,
    model folder and code file it names exists (a run directory `runs/<run>` is the test's own run)."""
    if not argv or argv[0] not in RUN_COMMANDS or any(o in argv for o in NEEDS_MORE):
        return False
    for option, value in zip(argv, argv[1:], strict=False):
        if "runs/<run>" in value:
            continue
        if option in PATH_OPTIONS and value != "smollm2" and not (ROOT / value).exists() and "<run>" not in value:
            return False
        if option in CODE_OPTIONS and ".py:" in value and not (ROOT / value.split(":")[0]).exists():
            return False
        if "<" in value:
            return False
    return True


RUNNABLE = sorted({tuple(argv) for _, argv in TYPED if runnable(argv)})
QUICK = {  # what keeps each kind of command to seconds
    "train": ["--steps", "1", "--eval-size", "4", "--eval-subset", "0", "--prompts-per-step", "2", "--group-size", "2",
              "--max-gen-rounds", "1", "--preflight-prompts", "2", "--preflight", "warn", "--max-new-tokens", "6",
              "--reward-workers", "0", "--threads", "1", "--device", "cpu", "--no-progress", "--save-model"],
    "preflight": ["--eval-size", "4", "--group-size", "2", "--max-gen-rounds", "1", "--preflight-prompts", "2",
                  "--max-new-tokens", "6", "--reward-workers", "0", "--threads", "1", "--device", "cpu"],
    "eval": ["--eval-size", "4", "--samples", "0", "--max-new-tokens", "6", "--device", "cpu"],
    "check-reward": ["--limit", "3"],
    "data": ["--limit", "20"],
}


ALIASES = {"--preflight": ("--no-preflight",)}  # a QUICK option the command names by another spelling
# The one line each check ends its verdict with; exit 1 is a verdict (a random model, a strict reward), not a failure.
VERDICTS = {
    "preflight": re.compile(r"^pre-flight: \d+ prompts x \d+ samples at <= \d+ tokens in \d+ s$", re.M),
    "check-reward": re.compile(r"^gold (forms|solutions) scoring the maximum: \d+", re.M),
}


def failed(command: str, out: str) -> bool:
    """Whether the printed verdict is a failure: a PROBLEM line; a probe row marked FAIL, or (a code reward's
    audit) gold solutions short of the maximum."""
    if command == "preflight":
        return bool(re.search(r"^  PROBLEM \(", out, re.M))
    gold = re.search(r"^gold solutions scoring the maximum: (\d+)/(\d+)", out, re.M)
    return bool(re.search(r"  FAIL(: .*)?$", out, re.M)) or bool(gold and int(gold[1]) < int(gold[2]))

# Commands whose documented outcome is a refusal: the exit status and how its one line on stderr starts.
EXPECTED = {
    ("train", "--dry-run", "--task", "calc", "--prompt-format", "plain"):  # docs/settings.md
        (2, "grpo train: error: prompt format plain writes one question and one answer"),
    ("train", "--group-size", "256", "--prompts-per-step", "64", "--max-new-tokens", "4096"):  # docs/memory.md
        (2, "grpo train: error: not enough memory: the run needs about "),
}


def quick_options(command: str, argv: list[str]) -> list[str]:
    """QUICK's overrides for ``command``, less those the command names itself."""
    quick, out, i = QUICK.get(command, []), [], 0
    while i < len(quick):
        group = quick[i:i + 2] if i + 1 < len(quick) and not quick[i + 1].startswith("--") else quick[i:i + 1]
        if not any(name in argv for name in (group[0], *ALIASES.get(group[0], ()))):
            out += group
        i += len(group)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random model folder, and a finished one-step run of it for the commands that read a run."""
    from conftest import make_model

    from grpo.cli import main

    place = tmp_path_factory.mktemp("docs")
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=5).save_pretrained(place / "model")
    tokenizer.save_pretrained(place / "model")
    run = place / "run"
    assert main(["train", *QUICK["train"], "--model", str(place / "model"), "--output", str(run),
                 "--save-every", "1"]) == 0
    return place


def as_quick(argv: list[str], tiny: Path, place: Path) -> list[str]:
    """The command with the test's model, run and output folder, and QUICK's overrides after it."""
    run = place / "run"
    shutil.copytree(tiny / "run", run)
    words = [w.replace("runs/<run>", str(run)) for w in argv]
    command = words[0]
    if tuple(argv) in EXPECTED:  # the documented model and sizes: the refusal comes before any weight loads
        words += [*quick_options(command, words), "--output", str(place / "out")]
    elif command in ("train", "preflight") and "--resume" not in words:
        words += [*quick_options(command, words), "--output", str(place / "out")]
        if "--model" not in words:
            words += ["--model", str(tiny / "model")]
    elif "--resume" in words:
        words = [w for i, w in enumerate(words) if w != "--steps" and (i == 0 or words[i - 1] != "--steps")]
        words += ["--steps", "2", "--no-progress"]
    else:
        words += quick_options(command, words)
        if command == "data" and "--model" not in words:  # grpo data loads the model's tokenizer
            words += ["--model", str(tiny / "model")]
    return words


@pytest.mark.parametrize("argv", RUNNABLE, ids=[f"grpo {' '.join(a)[:70]}" for a in RUNNABLE])
def test_every_grpo_command_this_machine_can_run_runs(argv, tiny, tmp_path, monkeypatch, capsys):
    import torch

    from grpo.cli import main

    monkeypatch.chdir(ROOT)  # the docs' paths are the repository's
    threads = torch.get_num_threads()
    try:
        code = main(as_quick(list(argv), tiny, tmp_path))
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    if tuple(argv) in EXPECTED:
        status, start = EXPECTED[tuple(argv)]
        lines = out.err.strip().splitlines()
        assert code == status and len(lines) == 1 and lines[0].startswith(start), out.err[-2000:]
        assert not (tmp_path / "out").exists()  # refused before anything was written
    elif argv[0] in VERDICTS:
        assert VERDICTS[argv[0]].search(out.out), out.out[-2000:] + out.err[-2000:]
        assert code == (1 if failed(argv[0], out.out) else 0), out.out[-2000:] + out.err[-2000:]
    else:
        assert code == 0, out.err[-2000:]


def test_the_runs_cover_the_readme_journeys():
    """The README's own commands are among those run, not only parsed."""
    readme = {tuple(a) for p, a in TYPED if p == "README.md"}
    ran = set(RUNNABLE) & readme
    assert ("tasks",) in ran
    assert any(a[0] == "train" and "--data" in a and "--rewards" in a for a in ran)
    assert any(a[0] == "eval" for a in ran) and any(a[0] == "report" for a in ran)


EXAMPLES = [words for _, words in ALL_COMMANDS if words[0] == "python" and words[1].startswith("examples/")]


@pytest.mark.slow
@pytest.mark.parametrize("words", EXAMPLES, ids=[" ".join(w) for w in EXAMPLES])
def test_every_example_command_runs(words):
    quick = ["--steps", "1", "--eval-size", "2", "--prompts", "2", "--group", "2"]
    result = subprocess.run([sys.executable, *words[1:], *quick], cwd=ROOT, capture_output=True, text=True,
                            timeout=900, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **ONE_THREAD})
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("config", ["", '{"task": "add", "data": "my rows.jsonl", "rewards": ["r.py:score"]}'])
def test_make_train_ends_with_the_commands_a_user_types_next(tmp_path, config):
    """`make train` in a fresh shell leaves the venv inactive: its last lines say to activate it, then name the
    report, the evaluation and a run on the user's own file, for the run just written (a stand-in grpo here,
    with or without a config.json naming a data file): commands to paste as they are,
    no <placeholder>, which the shell would read as a redirection."""
    fake = tmp_path / "bin"
    fake.mkdir()
    write = f"printf '%s' '{config}' > runs/20261202-120000-add/config.json\n" if config else ""
    (fake / "grpo").write_text("#!/bin/sh\nmkdir -p runs/20261202-120000-add\n" + write)
    (fake / "grpo").chmod(0o755)
    result = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "train", f"BIN={fake}", "STAMP="],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [line.split("#")[0].strip() for line in result.stdout.splitlines()]
    after = lines[lines.index("next:") + 1:]
    assert after[0] == "source .venv/bin/activate"
    assert "grpo report runs/20261202-120000-add" in after
    assert "grpo eval --model runs/20261202-120000-add/model --json" in after  # eval takes the run's source itself
    assert not any("<" in line for line in after)
    assert any(line.startswith("grpo train --data ") for line in after)
    from grpo.cli.parser import build_parser

    for line in (line for line in after if line.startswith("grpo ")):  # each one parses
        build_parser().parse_args(shlex.split(line)[1:])


def test_the_objectives_page_gives_each_recommended_setting_and_where_dppos_come_from():
    """docs/objectives.md's "defaults when unset" column is grpo.config.RECOMMENDED (and DPPO's cap the
    ratio_cap default), and the page says which DPPO values are not its reference recipe's: verl's DPPO
    recipe trains with clip_ratio_c=10000 and seq-mean-token-sum-norm (issue 52)."""
    from grpo.config import RECOMMENDED, TrainConfig

    page = (ROOT / "docs" / "objectives.md").read_text(encoding="utf-8")
    table = page.split("## Objectives")[1].split("\n\n")[1]
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `(\w+)`.*$", table, re.M)}
    for objective, rec in RECOMMENDED.items():
        row = rows[objective]
        if objective != "sapo":  # SAPO reads no clip value
            assert f"--clip-low {rec.clip_low:g}" in row and f"--clip-high {rec.clip_high:g}" in row, row
        assert f"--aggregate {rec.aggregate}" in row, row
    for objective in ("dppo_tv", "dppo_kl"):
        assert f"--ratio-cap {TrainConfig().ratio_cap:g}" in rows[objective]
    assert "Where the DPPO defaults come from" in page, "the page does not say where DPPO's defaults come from"
    recipe = page.split("Where the DPPO defaults come from")[1].split("\n\n")[0]
    for setting in ("clip_ratio_c=10000", "seq-mean-token-sum-norm", "--aggregate fixed", "--scale none"):
        assert setting in recipe, setting
    assert "grpo train --objective dppo_tv --ratio-cap 10000 --aggregate fixed --scale none" in page


def test_the_changelog_describes_the_memory_models_checkpointing_as_it_is():
    """CHANGELOG.md's entry on the memory prediction names what it counts under gradient checkpointing, the
    kept set of grpo/run/memory.py checkpointed_bytes, not the half of the activations that docs/memory.md says
    was replaced (issue 52)."""
    log = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    entry = next(e for e in log.split("\n- ") if e.startswith("The memory prediction counts"))
    assert "`checkpointed_bytes`" in entry, entry
    assert "def checkpointed_bytes(" in (ROOT / "grpo" / "run" / "memory.py").read_text(encoding="utf-8")
    assert "half the activations under gradient checkpointing" not in entry, entry
    assert "CHECKPOINT_KEPT" not in source_text()  # the half, replaced


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("torch", ["", "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"])
def test_make_passes_torch_to_pip_as_its_arguments(tmp_path, torch):
    """README's `make train TORCH="torch==2.13.0 --index-url .../whl/cpu"` reaches pip as a requirement and an
    option, not as one requirement named with spaces (a dry run of a fresh venv's setup; issue 52); without
    TORCH, pip gets the pinned torch==2.13.0 that README says is installed."""
    venv = tmp_path / "venv"
    result = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), "train", f"VENV={venv}",
                             *([f"TORCH={torch}"] if torch else [])],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    pips = [words[words.index("install") + 1:] for line in result.stdout.splitlines() if "pip install" in line
            for words in [shlex.split(line)]]
    installs = [args for args in pips if args[1:2] and args[1].startswith("torch")]  # after --quiet
    assert installs == [["--quiet", *(torch or "torch==2.13.0").split()]], result.stdout
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`torch==2.13.0`" in readme and "TORCH ?= torch==2.13.0" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert 'make train TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"' in readme
    assert "CPU build, transformers" not in readme  # what make installs is the index's torch, not a CPU build
