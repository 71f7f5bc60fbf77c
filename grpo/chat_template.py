"""Whether a model's tokenizer holds a chat template, read from its files before any weight loads: a GGUF file's
header (read here, key by key), a folder's tokenizer files, a hub id's in the local hub cache."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from grpo.models import EMBEDDED, ModelError, adapter_base, embedded_gguf, is_adapter_folder


def model_has_chat_template(name: str) -> bool | None:
    """Whether the model's tokenizer holds a chat template, read from its files before any weight loads: the
    GGUF header's ``tokenizer.chat_template`` (a .gguf file, the embedded model's), a folder's tokenizer files,
    a hub id's in the local hub cache (nothing is downloaded here). None where no file tells."""
    path = Path(name).expanduser()
    if name == EMBEDDED or path.suffix == ".gguf":
        try:
            return bool(gguf_string(embedded_gguf() if name == EMBEDDED else path, "tokenizer.chat_template"))
        except (OSError, ValueError, KeyError, struct.error, OverflowError):  # ModelError too: check_model names it
            return None
    if path.is_dir():
        return folder_has_chat_template(path, name)
    return _hub_has_chat_template(name)


def folder_has_chat_template(folder: Path, name: str) -> bool | None:
    """Whether a model folder's tokenizer files hold a chat template (tokenizer_config.json's chat_template,
    or a non-empty chat_template.jinja beside it, as transformers 5 writes and reads first; a
    chat_template.json is a processor's, which the tokenizer does not read). An adapter folder without
    tokenizer files: its base's."""
    if is_adapter_folder(name) and not (folder / "tokenizer_config.json").is_file():
        try:
            return model_has_chat_template(adapter_base(folder, name))
        except ModelError:
            return None
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():  # the tokenizer's template, over tokenizer_config.json's (an empty file: none)
        try:
            return bool(jinja.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    try:
        found = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return bool(found.get("chat_template")) if isinstance(found, dict) else None


def _hub_has_chat_template(name: str) -> bool | None:
    """A hub id's tokenizer files as the local hub cache holds them (None: not cached, or not a hub id)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        files = {f: try_to_load_from_cache(name, f) for f in ("tokenizer_config.json", "chat_template.jinja")}
    except ValueError:  # not a repository id
        return None
    found = [Path(f).parent for f in files.values() if isinstance(f, str)]
    return folder_has_chat_template(found[0], name) if found else None


GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type: bytes
GGUF_STRING, GGUF_ARRAY = 8, 9


class _GGUFHeader:
    """A GGUF file's metadata, read forwards from its start; ValueError where it runs past the file's end."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def take(self, size: int) -> int:
        if size < 0 or self.at + size > len(self.data):
            raise ValueError(f"{self.path}: its GGUF header runs past the end of the file")
        self.at += size
        return self.at - size

    def unpack(self, layout: str) -> tuple:
        return struct.unpack_from(layout, self.data, self.take(struct.calcsize(layout)))

    def string(self) -> str:
        (size,) = self.unpack("<Q")
        start = self.take(size)
        return self.data[start:start + size].decode("utf-8", "replace")

    def skip(self, kind: int) -> None:
        if kind == GGUF_STRING:
            self.string()
        elif kind != GGUF_ARRAY:
            self.take(GGUF_SIZES[kind])
        else:
            inner, items = self.unpack("<IQ")
            if inner in GGUF_SIZES:
                self.take(GGUF_SIZES[inner] * items)
            elif inner == GGUF_STRING and items <= len(self.data) // 8:
                for _ in range(items):
                    self.string()
            else:  # arrays of arrays, or more strings than the file could hold
                raise ValueError(f"{self.path}: a GGUF array this reader does not read")


def gguf_string(path: Path, key: str) -> str | None:
    """A string in a GGUF file's metadata, read from its header alone (gguf.GGUFReader maps every tensor's
    description too: seconds on the embedded model). ValueError for a file that is not GGUF v2 or later, or
    whose header runs past its end, counts more keys than it could hold or nests arrays."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        header = _GGUFHeader(data, path)
        magic, version, _, count = header.unpack("<4sIQQ")
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path} is not a GGUF v2+ file")
        if count > len(data) // 12:  # a key and its type take 12 bytes at least
            raise ValueError(f"{path}: its GGUF header counts more keys than the file could hold")
        for _ in range(count):
            name = header.string()
            (kind,) = header.unpack("<I")
            if name == key:
                return header.string() if kind == GGUF_STRING else None
            header.skip(kind)
    return None
