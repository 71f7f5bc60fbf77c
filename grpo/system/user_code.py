"""The user's own code, named on the command line: ``path/to/file.py:name`` or ``package.module:name``.

Rewards (grpo/rewards/resolve.py), tools and environments (grpo/sampling/tools.py)
are all named this way; one importer turns the part before the colon into
a module, and a file that is missing or fails to import into one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FILES: dict[str, str] = {}  # module name -> the .py file it was loaded from (for a fresh interpreter to load again)


def import_user_module(where: str, what: str, error: type[Exception]) -> ModuleType:
    """The module at ``where`` (a ``.py`` file or an importable module name); ``error(message)`` when
    it cannot be imported, the message naming ``what`` it was for ("reward", "tool", ...)."""
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise error(f"{what} file not found: {where}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        # registered while it runs, as an import would (dataclasses look their module up); a taken name stays
        registered = sys.modules.setdefault(spec.name, module) is module
        try:
            spec.loader.exec_module(module)
        except Exception as err:  # the user's file: report it, don't trace
            if registered:
                del sys.modules[spec.name]
            raise error(f"cannot import {what} file {where}: {err}") from err
        if registered:
            FILES[spec.name] = str(path.resolve())
        return module
    if not where or where.startswith("."):
        raise error(f"{what} {where!r}: name a .py file or an importable module before the colon")
    try:
        return importlib.import_module(where)
    except Exception as err:  # the user's module: report it, don't trace
        raise error(f"cannot import {what} module {where!r}: {err}") from err
