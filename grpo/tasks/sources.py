"""Where a data source's rows come from: the file, folder or hub dataset, its configuration and its splits.

A source opens into named splits, each read lazily as (location, record) pairs:

- a single file (.jsonl, .json, .csv, .parquet) is one split, ``train``;
- a folder saved by ``datasets`` (``save_to_disk``): a DatasetDict's splits, or a Dataset as ``train``;
- a folder of split files, one per split and named by it (``train.jsonl``, ``test.csv``, ...);
- a local folder laid out as a hub dataset (a README.md whose YAML header declares ``configs`` with their
  ``data_files``): the named configuration's files, as ``datasets.load_dataset(folder, config)`` reads them;
- a hub name (or another folder ``datasets`` reads): ``datasets.load_dataset(source, config)``.

A source with several configurations and none named is refused in one line listing them.

A location names the file and line (or the dataset and row) so that an error can point at the row.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from grpo.tasks.base import TaskError

Records = Iterator[tuple[str, dict]]
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
EVAL_SPLITS = ("test", "validation")  # the held-out split a dataset offers, in the order they are looked for


class DataError(TaskError):
    """A dataset that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class Source:
    """A data source opened: the name given, the configuration read ("" where it has none) and its splits
    by name, in the source's order, each a function that reads the split's records."""

    name: str
    config: str
    splits: Mapping[str, Callable[[], Records]]

    def records(self, split: str) -> Records:
        if split not in self.splits:
            raise DataError(f"{self.name} has no split {split!r} (it has {', '.join(self.splits)})")
        return self.splits[split]()

    def train_split(self) -> str:
        """The split trained on when none is named: ``train``, else the only one."""
        if "train" in self.splits:
            return "train"
        if len(self.splits) == 1:
            return next(iter(self.splits))
        raise DataError(f"{self.name} has no train split (it has {', '.join(self.splits)}): name one with --data-split")

    def eval_split(self, train: str) -> str:
        """The held-out split when none is named: ``test``, else ``validation``, else ``train`` itself
        (then the held-out rows are a disjoint split of it)."""
        return next((s for s in EVAL_SPLITS if s in self.splits and s != train), train)


def open_source(source: str, config: str = "") -> Source:
    """The source's splits; ``config``: the configuration to read, where the source has several."""
    path = Path(source).expanduser()
    if path.is_file():
        if config:
            raise DataError(f"{source} is one file, with no configurations (--data-config {config})")
        return Source(source, "", {"train": lambda: file_records(path)})
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return _saved(source, path, config)
        declared = _declared_configs(path)
        if declared:
            return _card(source, path, declared, config)
        files = _split_files(path)
        if files:
            if config:
                raise DataError(f"{source} is a folder of split files, with no configurations (--data-config {config})")
            return Source(source, "", {name: _files_records([f]) for name, f in files.items()})
    elif path.suffix.lower() in SUFFIXES or source.startswith((".", "/", "~")):
        raise DataError(f"data file not found: {source}")
    return _hub(source, config)


def file_records(path: Path) -> Records:
    """(location, record) for every row of a .jsonl, .json, .csv or .parquet file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _jsonl(path)
    if suffix == ".csv":
        return _csv(path)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return ((f"{path}: row {i + 1}", r) for i, r in enumerate(pq.read_table(path).to_pylist()))
    raise DataError(f"{path}: unsupported data file (use .jsonl, .csv or .parquet)")


def _jsonl(path: Path) -> Records:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{n}: invalid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{n}: expected a JSON object, got {type(record).__name__}")
            yield f"{path}:{n}", record


def _csv(path: Path) -> Records:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        for record in reader:
            yield f"{path}:{reader.line_num}", record


def _split_files(path: Path) -> dict[str, Path]:
    """A folder's data files by split name (the file's stem); two files for one split are an error."""
    found: dict[str, Path] = {}
    for f in sorted(path.iterdir()):
        if f.is_file() and f.suffix.lower() in SUFFIXES:
            if f.stem in found:
                raise DataError(f"{path}: two files for split {f.stem!r} ({found[f.stem].name}, {f.name}); keep one")
            found[f.stem] = f
    return found


def _declared_configs(path: Path) -> list[dict]:
    """The ``configs`` a folder's README.md declares in its YAML header (the hub's dataset card), or []."""
    readme = path / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if not text.startswith("---"):
        return []
    import yaml

    try:
        header = yaml.safe_load(text.split("---", 2)[1])
    except yaml.YAMLError as err:
        raise DataError(f"{readme}: its YAML header does not parse ({_first_line(err)})") from None
    configs = header.get("configs") if isinstance(header, dict) else None
    if configs is None:
        return []
    if not isinstance(configs, list) or not all(isinstance(c, dict) and "config_name" in c for c in configs):
        raise DataError(f"{readme}: configs must be a list of entries with a config_name and their data_files")
    return configs


def _card(source: str, path: Path, configs: list[dict], config: str) -> Source:
    """A local folder laid out as a hub dataset, read as ``datasets.load_dataset(folder, config)`` reads it:
    each configuration's ``data_files``, a path or a list of them (the train split), or a list of
    {split, path} (paths relative to the folder; globs allowed). Read here, file by file, so an error names
    the line and an edited file is read as it is now (no cache)."""
    names = [str(c["config_name"]) for c in configs]
    if config and config not in names:
        raise DataError(f"{source} has no configuration {config!r} (it has {', '.join(names)})")
    if not config and len(names) > 1:
        raise DataError(f"{source} has configurations {', '.join(names)}: name one with --data-config "
                        "(--eval-config for --eval-data)")
    chosen = configs[names.index(config or names[0])]
    given = chosen.get("data_files")
    entries = [{"split": "train", "path": given}] if isinstance(given, (str, list)) and not (
        isinstance(given, list) and given and isinstance(given[0], dict)) else given
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path / 'README.md'}: configuration {chosen['config_name']} has no data_files")
    splits = {}
    for entry in entries:
        patterns = [entry["path"]] if isinstance(entry["path"], str) else list(entry["path"])
        files = [f for pattern in patterns for f in sorted(path.glob(pattern))]
        if not files:
            raise DataError(f"{source}: no file matches {', '.join(patterns)} (configuration {chosen['config_name']})")
        splits[str(entry.get("split", "train"))] = _files_records(files)
    return Source(source, str(chosen["config_name"]), splits)


def _files_records(files: list[Path]) -> Callable[[], Records]:
    return lambda: (record for f in files for record in file_records(f))


def _datasets(source: str) -> object:
    try:
        import datasets
    except ImportError:
        raise DataError(f"data {source!r} is not a file, and the `datasets` package is not installed") from None
    datasets.disable_progress_bars()
    return datasets


def _dataset_records(source: str, ds: object) -> Callable[[], Records]:
    return lambda: ((f"{source}: row {i + 1}", dict(r)) for i, r in enumerate(ds))


def _saved(source: str, path: Path, config: str) -> Source:
    """A folder written by ``save_to_disk``: a DatasetDict's splits, or a Dataset as ``train``."""
    if config:
        raise DataError(f"{source} is a saved dataset, with no configurations (--data-config {config})")
    datasets = _datasets(source)
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:
        raise DataError(f"cannot load dataset {source!r}: {_first_line(err)}") from None
    if isinstance(ds, datasets.DatasetDict):
        return Source(source, "", {name: _dataset_records(source, split) for name, split in ds.items()})
    return Source(source, "", {"train": _dataset_records(source, ds)})


def _hub(source: str, config: str) -> Source:
    """A hub dataset, or a local folder laid out as one, through ``datasets.load_dataset``."""
    datasets = _datasets(source)
    try:
        names = list(datasets.get_dataset_config_names(source))
    except Exception as err:
        raise DataError(f"cannot load dataset {source!r}: {_first_line(err)}") from None
    if config and names and config not in names:
        raise DataError(f"{source} has no configuration {config!r} (it has {', '.join(names)})")
    if not config and len(names) > 1:
        raise DataError(f"{source} has configurations {', '.join(names)}: name one with --data-config "
                        "(--eval-config for --eval-data)")
    try:
        splits = datasets.load_dataset(source, config or None)
    except Exception as err:
        raise DataError(f"cannot load dataset {source!r}: {_first_line(err)}") from None
    read = config or (names[0] if names and names[0] != "default" else "")
    return Source(source, read, {name: _dataset_records(source, ds) for name, ds in splits.items()})


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
