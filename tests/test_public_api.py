"""The names `import grpo` offers: each resolves, none hides a submodule, and importing grpo loads no torch."""

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import grpo

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves():
    for name in grpo.__all__:
        assert getattr(grpo, name) is not None, name
    assert set(grpo.__all__) <= set(dir(grpo))


def test_public_names_are_defined_where_the_mapping_says():
    for name, module in grpo._LAZY.items():
        assert getattr(importlib.import_module(module), name) is getattr(grpo, name)


def test_no_public_name_is_a_submodule_name():
    # `import grpo.sampling.evaluate` sets the attribute grpo.sampling.evaluate to the module, shadowing a function so named
    submodules = {m.name for m in pkgutil.iter_modules(grpo.__path__)}
    assert not submodules & set(grpo.__all__)


def test_an_unknown_name_is_an_attribute_error():
    try:
        grpo.no_such_name  # noqa: B018
    except AttributeError as err:
        assert "no_such_name" in str(err)
    else:
        raise AssertionError("grpo.no_such_name resolved")


def test_import_grpo_does_not_import_torch():
    code = "import sys, grpo; grpo.TrainConfig(); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert out.stdout.strip() == "[]", out.stdout
