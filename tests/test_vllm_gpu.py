"""vLLM on a GPU with the defaults, by the values grpo computes (no GPU here): its share of the device
sized from the weights and a round's KV cache, the dtype the device computes, the CPU backend's prefill
setting kept off a GPU, and the room in /dev/shm checked before the weights are written there."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import grpo
import grpo.sampling.vllm_engine
from grpo.config import ConfigError, TrainConfig
from grpo.run.memory import other_processes
from grpo.run.memory_shapes import GIB, Device, ModelShape, RunShape
from grpo.sampling.vllm_device import VLLM_GPU_ALLOWANCE, check_room, engine_dtype, vllm_share
from grpo.sampling.vllm_engine import EngineError, VLLMEngine
from grpo.system.distributed import World

# Qwen2.5-1.5B's config.json sizes: 1.54 B parameters, 3.1 GB in bf16
QWEN_1_5B = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 1536, "intermediate_size": 8960,
             "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151936,
             "tie_word_embeddings": True}
GPU_24GB = Device("cuda", 1, None, 24 * 10**9)


def test_vllms_share_holds_its_weights_and_a_rounds_kv_cache():
    model = ModelShape.from_config(QWEN_1_5B)
    rows, tokens = 8 * 16, 1024 + 256  # a round of 16 prompts x G 8, prompt and completion
    share = vllm_share(model, rows, tokens, GPU_24GB)
    kv = rows * tokens * 28 * 2 * 2 * 128 * 2  # 2 (K, V) x L x KV heads x head_dim x 2 bytes per token
    assert share * GPU_24GB.total == pytest.approx(2 * model.params + kv + VLLM_GPU_ALLOWANCE)
    assert share * GPU_24GB.total > 2 * model.params > 0.1 * GPU_24GB.total  # the old default's 2.4 GB
    assert vllm_share(model, 10**5, 10**5, GPU_24GB) == 0.9  # never the whole GPU
    assert vllm_share(model, rows, tokens, GPU_24GB, given=0.3) == 0.3  # --vllm-memory as given
    assert vllm_share(model, rows, tokens, Device("cpu", 1, None, 64 * GIB)) == 0.1  # the CPU backend's


def test_the_memory_prediction_counts_the_share_vllm_is_given():
    model = ModelShape.from_config(QWEN_1_5B)
    run = RunShape(group_size=8, prompts_per_step=16, max_new_tokens=256, prompt_tokens=1024, micro_batch_tokens=4096,
                   engine="vllm", lora_rank=8)
    assert other_processes(model, run, GPU_24GB)["vllm"] == int(vllm_share(model, 128, 1280, GPU_24GB) * GPU_24GB.total)


def test_the_engine_is_given_its_share_for_the_run(monkeypatch):
    from conftest import make_model

    from grpo.run.build import engine_share

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * 10**9, 24 * 10**9))
    model = make_model(64)
    config = TrainConfig(engine="vllm", prompts_per_step=16, group_size=8)
    share = engine_share(config, World(size=2), torch.device("cuda:0"), model, 512)
    expected = vllm_share(ModelShape.from_config(model.config), 8 * 8, 512, GPU_24GB)
    assert share == expected and 0.0 < share < 0.9
    assert engine_share(TrainConfig(engine="vllm", vllm_memory=0.25), World(), torch.device("cuda:0"), model, 512) == 0.25
    assert engine_share(config, World(), torch.device("cpu"), model, 512) == 0.1


def test_vllm_samples_in_the_dtype_the_gpu_computes(monkeypatch):
    capability = {"now": (7, 5)}  # a T4
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["now"])
    assert engine_dtype(torch.device("cuda:0")) == "float16"
    capability["now"] = (7, 0)  # a V100
    assert engine_dtype(torch.device("cuda:0")) == "float16"
    capability["now"] = (8, 0)  # an A100
    assert engine_dtype(torch.device("cuda:0")) == "bfloat16"
    assert engine_dtype(torch.device("cpu")) == "float32"


def _worker():
    path = Path(grpo.__file__).parent / "vllm_side" / "grpo_vllm_worker.py"
    spec = importlib.util.spec_from_file_location("grpo_vllm_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cpu_backends_whole_batch_prefill_is_not_asked_of_a_gpu():
    settings = {"model": "m", "dtype": "bfloat16", "seed": 0, "memory": 0.3, "max_model_len": 64, "lora_rank": 0}
    worker = _worker()
    assert "max_num_batched_tokens" not in worker.engine_options({**settings, "cpu": False})
    assert worker.engine_options({**settings, "cpu": True})["max_num_batched_tokens"] == 65536


def test_dev_shm_without_room_for_the_weights_is_refused_before_they_are_written(monkeypatch, tmp_path):
    from conftest import make_model

    monkeypatch.setattr(grpo.sampling.vllm_engine, "find_python", lambda configured="": "python")
    engine = VLLMEngine(make_model(64), SimpleNamespace(pad_token_id=0, eos_token_id=1), max_model_len=64)
    try:
        free = SimpleNamespace(total=10**9, used=10**9 - 1000, free=1000)  # 1000 bytes left
        monkeypatch.setattr(shutil, "disk_usage", lambda path: free)
        with pytest.raises(EngineError, match=r"^--engine vllm: \S+ has 0\.0 GiB free, and the weights vLLM "
                                              r"loads need [0-9.]+ GiB there; [^\n]+$"):
            engine.start()
        assert not (engine.dir / "model").exists() and engine.proc is None
        with pytest.raises(EngineError, match="the push buffer"):
            check_room(tmp_path, 2000, "the push buffer")
    finally:
        engine.close()


def _gpu_prediction(**run_options):
    from grpo.run.memory import predict

    model = ModelShape.from_config(QWEN_1_5B)
    options = dict(group_size=8, prompts_per_step=16, max_new_tokens=512, prompt_tokens=128, micro_batch_tokens=8192,
                   lora_rank=16, reward_workers=2, tool_workers=2)
    run = RunShape(**{**options, **run_options})
    return model, predict(model, run, Device("cuda", 1, 16 * GIB, 16 * GIB)), run


def test_on_a_gpu_host_memory_is_counted_apart_from_the_gpus():
    from grpo.run.memory import WORKER_BYTES

    model, pred, _ = _gpu_prediction(engine="vllm", vllm_memory=0.3)
    # the workers, the push buffer (none: LoRA pushes an adapter) and the save buffer are host memory
    assert pred.host == {"reward_workers": 3 * WORKER_BYTES, "tool_workers": 3 * WORKER_BYTES,
                         "save_buffer": 4 * model.params}
    assert "save_buffer" not in pred.terms and set(pred.others) == {"vllm"}  # vLLM's share is the GPU's
    assert pred.needed == max(pred.peak, pred.reserved) + pred.others["vllm"]


def test_a_gpus_sampling_counts_fp32_keys_and_the_bf16_weights():
    from grpo.run.memory import kv_cache_bytes, sampling_terms

    model = ModelShape.from_config(QWEN_1_5B)
    gpu, cpu = Device("cuda", 1, None, 16 * GIB), Device("cpu", 1, None, 16 * GIB)
    own = sampling_terms(model, 128, 640, 2, gpu)
    assert own["kv_cache"] == kv_cache_bytes(model, 128, 640, 2) * 3 // 2  # keys fp32 (4 bytes), values bf16 (2)
    assert own["autocast_weights"] == 2 * model.layers * model.layer_params  # autocast's bf16 copies
    assert sampling_terms(model, 128, 640, 2, gpu, fsdp=True)["gathered_weights"] == 2 * model.params
    assert "autocast_weights" not in sampling_terms(model, 128, 640, 4, cpu)


def test_host_memory_short_of_a_gpu_runs_host_terms_is_refused_in_one_line():
    from grpo.run.memory_check import check_host

    _, pred, _ = _gpu_prediction()
    check_host(pred, 64 * GIB)  # fits
    with pytest.raises(ConfigError, match=r"^not enough host memory: .* the largest term is save_buffer \([0-9.]+ GiB\)"
                                          r": shrink it with --no-save-model[^\n]*$"):
        check_host(pred, GIB)
