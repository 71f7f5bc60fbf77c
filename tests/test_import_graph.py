"""The package's modules import one another without a circle: not at load time, not inside a function,
not under ``if TYPE_CHECKING`` (a type-only circle still ties two modules into one that cannot be read or
tested apart). Importing a submodule initialises its parent package first; that edge is Python's, not the
code's, and is not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRPO = Path(__file__).resolve().parents[1] / "grpo"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules that a module imports anywhere in its text (``from grpo.x import y`` counts
    grpo.x.y when that is a module, else grpo.x)."""
    here = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(paths)
    return {name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
            for name, path in paths.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        if start in done:
            continue
        path.append(start), on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop(), path.pop(), on_path.discard(node), done.add(node)
            elif child in on_path:
                return [*path[path.index(child):], child]
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child), on_path.add(child)
    return None


def test_no_module_of_the_package_imports_itself_round_a_circle():
    circle = find_circle(import_graph(GRPO))
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_a_circle_is_found_even_when_one_edge_is_type_only(tmp_path):
    pkg = tmp_path / "grpo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from grpo.sub.c import C\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from grpo.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from grpo.sub import c\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\n")
    assert find_circle(import_graph(pkg)) == ["grpo.a", "grpo.b", "grpo.sub.c", "grpo.a"]
    (pkg / "sub" / "c.py").write_text("import grpo.sub\n")  # a submodule importing its own package: a circle
    assert find_circle(import_graph(pkg)) == ["grpo.sub.c", "grpo.sub", "grpo.sub.c"]
    (pkg / "sub" / "c.py").write_text("")
    assert find_circle(import_graph(pkg)) is None


def test_the_trainer_hands_the_phases_no_forwarding_methods():
    """The phases are module functions that take plain values (grpo/sampling/step_parts.py); the trainer's public
    methods are the run's own, none a round trip that hands ``self`` to a phase that reads it back."""
    from grpo.run.trainer import GRPOTrainer

    public = {name for name, value in vars(GRPOTrainer).items() if not name.startswith("_") and callable(value)}
    assert public == {"step", "train", "close", "checkpoint_parts"}
    properties = [name for name, value in vars(GRPOTrainer).items() if isinstance(value, property)]
    assert properties == []


@pytest.mark.parametrize("fits", [False, True], ids=["no-preflight", "preflight-fits-the-limit"])
def test_the_config_is_assigned_once_and_the_sampler_built_once(tmp_path, monkeypatch, fits):
    """What the steps read of the config is settled once: when the trainer is built, or, where the pre-flight
    check can change it (here it fits the token limit to the data), once the check has settled its values.
    A run never assigns trainer.config again, and builds its prompt sampler once, after the check."""
    from tiny_run import tiny_trainer

    import grpo.run.trainer
    from grpo.run.trainer import GRPOTrainer

    assigned, built = [], []
    setattr_, make_sampler = GRPOTrainer.__setattr__, grpo.run.trainer.make_sampler

    def watch(self, name, value):
        if name == "config":
            assigned.append(value)
        setattr_(self, name, value)

    monkeypatch.setattr(GRPOTrainer, "__setattr__", watch)
    monkeypatch.setattr(grpo.run.trainer, "make_sampler", lambda *a, **kw: built.append(kw) or make_sampler(*a, **kw))
    # no token limit given, and none tuned for the task: the check samples at 256 and fits one (any "a" ends
    # a completion, so the tiny model's end soon and the check stops at the limit it will fit)
    checked = dict(preflight="warn", max_new_tokens=0, preflight_prompts=2, max_gen_rounds=1, stop=("a",),
                   eval_size=4) if fits else {}
    trainer = tiny_trainer(steps=2, **checked)
    if not fits:
        assert len(assigned) == 1
    trainer.train(tmp_path / "run")
    trainer.close()
    assert len(assigned) == 1 and trainer.config is assigned[0]
    assert len(built) == 1
    if fits:  # the run's limit is the fitted one, settled before the sampler was built
        assert trainer.config.max_new_tokens < 256 and trainer.sampling.config is trainer.config


def test_a_trainer_whose_preflight_may_fit_steps_by_hand_with_the_config_as_given():
    """step(n) without train() (bench scripts, the Python API): no pre-flight runs, the config is the one
    given, settled once on the first step."""
    from tiny_run import tiny_trainer

    trainer = tiny_trainer(steps=1, preflight="warn", max_new_tokens=0, preflight_prompts=2, max_gen_rounds=1,
                           eval_size=4)
    try:
        assert trainer.config is None  # the check could change it: not settled yet
        metrics = trainer.step(1)
        assert trainer.config is trainer.draft and trainer.sampling.config is trainer.config
        assert metrics["generated_groups"] >= 1
    finally:
        trainer.close()


MODULE_LINES, FUNCTION_LINES = 400, 50  # the style's limits (../shared/STYLE.md)


def oversized(root: Path) -> list[str]:
    """The package's modules over MODULE_LINES lines and functions over FUNCTION_LINES (from the ``def``
    line, decorators left out, to the last line of the body, docstring included), as 'path:line name: n'."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(root.parent)
        if len(text.splitlines()) > MODULE_LINES:
            out.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    out.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    return out


def test_no_module_or_function_of_the_package_is_over_the_size_limits():
    assert oversized(GRPO) == []


def test_an_oversized_module_and_function_are_found(tmp_path):
    pkg = tmp_path / "grpo"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n" + "    x = 1\n" * FUNCTION_LINES + "\n" * (MODULE_LINES - FUNCTION_LINES))
    assert oversized(pkg) == [f"grpo/a.py: {MODULE_LINES + 1} lines", f"grpo/a.py:1 f: {FUNCTION_LINES + 1} lines"]
    (pkg / "a.py").write_text("def f():\n" + "    x = 1\n" * (FUNCTION_LINES - 1))
    assert oversized(pkg) == []


TRAINER_LINES = 350  # grpo/run/trainer.py is the loop alone: a new feature gets its own module and a line in it


def test_the_trainer_module_stays_under_its_limit():
    lines = len((GRPO / "run" / "trainer.py").read_text().splitlines())
    assert lines < TRAINER_LINES, f"grpo/run/trainer.py has {lines} lines (limit: under {TRAINER_LINES})"


# The parts of the package, lowest first: a module may import its own part and the parts below it, never one
# above (docs/architecture.md, "The source tree"). The modules at the top of grpo/ are the configuration's floor (config,
# config_resolution, trl_config, models, chat_template, refusals: read before anything loads) or the entry points (api,
# __main__, __init__).
PARTS = ("math", "system", "rewards", "tasks", "base", "sampling", "learning", "observe", "run", "cli", "top")
BASE = ("config", "config_resolution", "trl_config", "models", "chat_template", "refusals")
TOP_MODULES = 12  # at most this many modules at the top of grpo/, folders aside


def part_of(module: str) -> str:
    """The part a module of the package belongs to: its folder under grpo/, or base or top for the modules at the top."""
    inside = module.split(".")[1:]
    if not inside or inside[0] in ("api", "__main__"):
        return "top"
    if inside[0] in BASE:
        return "base"
    if inside[0] == "vllm_side":  # vLLM's worker extension: runs in vLLM's process and imports nothing of grpo's
        return "math"
    return inside[0]


def upward_imports(root: Path) -> list[str]:
    """Each import from a part above the importer's, as 'importer (its part) -> imported (its part)'."""
    out = []
    for name, imports in sorted(import_graph(root).items()):
        for other in sorted(imports):
            here, there = part_of(name), part_of(other)
            if PARTS.index(there) > PARTS.index(here):
                out.append(f"{name} ({here}) -> {other} ({there})")
    return out


def test_each_part_imports_only_its_own_and_the_parts_below_it():
    assert upward_imports(GRPO) == []
    assert {part_of(name) for name in import_graph(GRPO)} == set(PARTS)  # every part named, none left out


def test_an_import_from_a_part_above_is_found(tmp_path):
    pkg = tmp_path / "grpo"
    for folder in ("math", "run"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "run" / "loop.py").write_text("from grpo.math import losses\n")
    (pkg / "math" / "losses.py").write_text("def f():\n    from grpo.run.loop import g\n")  # late, still upward
    assert upward_imports(pkg) == ["grpo.math.losses (math) -> grpo.run.loop (run)"]


def test_few_modules_at_the_top_of_the_package():
    top = sorted(path.name for path in GRPO.glob("*.py"))
    assert len(top) <= TOP_MODULES, top


def classes_named_twice(root: Path) -> list[str]:
    """Class names that the package's modules define at their top level more than once, as 'Name: path, path'
    (a class defined inside a string, as a probe's code is, is no class of the package)."""
    where: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(root.parent)))
    return [f"{name}: {', '.join(paths)}" for name, paths in sorted(where.items()) if len(paths) > 1]


def test_one_class_per_name():
    assert classes_named_twice(GRPO) == []


def test_a_class_name_used_twice_is_found(tmp_path):
    pkg = tmp_path / "grpo"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b.py").write_text("class Run:\n    pass\n")
    (pkg / "a" / "c.py").write_text("class Run:\n    pass\nSOURCE = 'class Run: pass'\n")
    assert classes_named_twice(pkg) == ["Run: grpo/a/c.py, grpo/b.py"]
