"""The docs say what the code does: every `grpo` command in a shell code block of README.md and docs/*.md
parses with `grpo`'s own parser, and a train or preflight command also builds its TrainConfig (so an invalid
value fails); those this machine can run (no GPU, vLLM, hub download or file of the reader's own) run; every
`make` target named exists; every option, metric or alarm named in backticks exists in the code; every
relative link resolves, and README links every page of docs/.

Pages are found at run time (docs/*.md), so a page added later is checked the same way. Commands run in this
process on a tiny random model, with small overrides for the options the command does not name itself (one
step, a few held-out prompts, a fresh output folder) that keep the layer to a few minutes; a command whose
documented outcome is a refusal (EXPECTED) runs as written and must give that outcome. `python examples/...`
runs the embedded model (slow).
"""

from __future__ import annotations

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
RUN_COMMANDS = ("train", "preflight", "eval", "report", "tasks", "check-reward")
NEEDS_MORE = ("--engine", "--nproc", "--fsdp", "--device", "--async-lag", "--config", "--help")  # GPU, vLLM, ...
PATH_OPTIONS = ("--data", "--eval-data", "--model", "--chat-template")
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
