"""The final model's save (grpo/models.py save_model) is atomic: a process killed at any point of it
leaves a complete model, the old or the new, and a rename that fails is an error, not a success."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import grpo.models
from grpo.models import ModelError, save_model


class Folder:
    """A model and its tokenizer as save_model sees them: save_pretrained writes a folder, here a config
    and a weights file that say which model they are."""

    def __init__(self, name: str) -> None:
        self.name = name

    def save_pretrained(self, path: Path, state_dict: dict | None = None) -> None:
        (Path(path) / "config.json").write_text(json.dumps({"name": self.name}))
        (Path(path) / "model.safetensors").write_text(self.name)


def model_at(folder: Path) -> str | None:
    """The name of the complete model in ``folder`` (config and weights agree), or None."""
    try:
        name = json.loads((folder / "config.json").read_text())["name"]
        return name if (folder / "model.safetensors").read_text() == name else None
    except (OSError, ValueError):
        return None


# a process that saves "new" over "old" and is killed (SIGKILL: no finally, no cleanup) at one point of it
KILLED = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import grpo.models
    from test_save_model import Folder
    point, dest = sys.argv[1], Path(sys.argv[2])
    calls = {{"replace": 0}}
    replace, rmtree = os.replace, shutil.rmtree

    def killing_replace(src, dst):
        calls["replace"] += 1
        if point == f"replace{{calls['replace']}}":
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst)

    def killing_rmtree(path, *args, **kw):
        if point == "remove" and Path(path).name == dest.name + ".previous" and Path(path).exists():
            os.kill(os.getpid(), signal.SIGKILL)
        rmtree(path, *args, **kw)

    grpo.models.os.replace = killing_replace
    grpo.models.shutil.rmtree = killing_rmtree
    grpo.models.save_model(Folder("new"), Folder("new"), dest)
""")


@pytest.mark.parametrize("point", ["replace1", "replace2", "remove", "none"])
def test_a_save_killed_at_any_step_leaves_a_complete_model(point, tmp_path):
    dest = tmp_path / "model"
    save_model(Folder("old"), Folder("old"), dest)
    proc = subprocess.run([sys.executable, "-c", KILLED.format(tests=str(Path(__file__).parent)), point, str(dest)],
                          capture_output=True, text=True)
    assert proc.returncode == (0 if point == "none" else -9), proc.stderr
    here, aside = model_at(dest), model_at(tmp_path / "model.previous")
    assert here or aside, f"killed at {point}: no complete model left"
    # the new model, once at dest, stays; before that the old one is at dest or beside it
    assert (here, aside) == {"replace1": ("old", None), "replace2": (None, "old"), "remove": ("new", "old"),
                             "none": ("new", None)}[point]
    save_model(Folder("next"), Folder("next"), dest)  # the next save finds its way from whatever was left
    assert model_at(dest) == "next" and not (tmp_path / "model.previous").exists()


def test_a_rename_that_fails_is_an_error_and_the_old_model_stays(tmp_path, monkeypatch):
    dest = tmp_path / "model"
    save_model(Folder("old"), Folder("old"), dest)
    replace = grpo.models.os.replace

    def failing(src, dst):
        if Path(dst) == dest and ".tmp" in Path(src).name:
            raise PermissionError(13, "Permission denied")
        replace(src, dst)

    monkeypatch.setattr(grpo.models.os, "replace", failing)
    with pytest.raises(ModelError, match=f"cannot save the model to {dest}: Permission denied"):
        save_model(Folder("new"), Folder("new"), dest)
    assert model_at(dest) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing half-written left beside it


def test_the_gguf_cache_keeps_a_copy_another_process_placed_first(tmp_path):
    # place_folder(replace=False), the cache's: a complete folder already there wins, tmp stays to be removed
    dest, tmp = tmp_path / "model", tmp_path / "model.tmp1"
    for folder, name in ((dest, "first"), (tmp, "second")):
        folder.mkdir()
        Folder(name).save_pretrained(folder)
    grpo.models.place_folder(tmp, dest, replace=False)
    assert model_at(dest) == "first" and model_at(tmp) == "second"
