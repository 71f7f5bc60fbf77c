"""One notion of "training an adapter", however it came (--lora-rank, or an adapter folder as --model), and
the combinations that are not built, refused before anything loads or forks (grpo/refusals.py)."""

from __future__ import annotations

import psutil
import pytest
import torch
from conftest import make_model, make_tokenizer
from tiny_run import tiny_config, tiny_task

from grpo.cli import main as cli_main
from grpo.config import ConfigError
from grpo.models import adapter_rank, base_weights, trains_adapter
from grpo.run.build import resolve_run
from grpo.run.process_setup import setup_process
from grpo.run.trainer import GRPOTrainer


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    """A rank-4 PEFT adapter saved from the tiny model (its base saved beside it), as a user brings one."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("adapter")
    tokenizer, base = make_tokenizer(), make_model(len(make_tokenizer()), seed=3)
    base.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():  # a trained adapter: B is no longer zero, so the policy is not its base
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    peft.peft_config["default"].base_model_name_or_path = str(root / "base")
    peft.save_pretrained(root / "adapter")
    return root / "adapter"


def _trainer(**kw) -> GRPOTrainer:
    config = tiny_config(**kw)
    setup_process(config)
    return GRPOTrainer(resolve_run(config, task=tiny_task()), progress=False)


def _no_vllm_needed(monkeypatch):
    """The engine object is built (it starts vLLM only at the first rollout); no vLLM Python is asked for."""
    monkeypatch.setattr("grpo.sampling.vllm_engine.find_python", lambda python="": "python")


def test_an_adapter_folder_trains_an_adapter_for_vllm_and_the_reference(adapter_dir, monkeypatch):
    _no_vllm_needed(monkeypatch)
    trainer = _trainer(model=str(adapter_dir), engine="vllm", beta=0.04)
    try:
        assert trains_adapter(trainer.model) and adapter_rank(trainer.model) == 4
        # vLLM samples with the adapter (a LoRA request of its rank), on the base's weights under the base's names
        assert trainer.engine.lora_rank == 4
        names = set(base_weights(trainer.model))
        assert names == set(make_model(len(make_tokenizer())).state_dict())  # a plain Llama's names
        assert not any("base_layer" in n or "lora_" in n for n in names)
        # the KL reference is the base, the adapter switched off, as for --lora-rank: no copy of the model
        assert trainer.reference is None
    finally:
        trainer.close()


def test_lora_rank_and_a_full_model_give_the_same_answers():
    trainer = _trainer(lora_rank=8, beta=0.04)
    full = make_model(len(make_tokenizer()))
    try:
        assert trains_adapter(trainer.model) and adapter_rank(trainer.model) == 8 and trainer.reference is None
        assert not trains_adapter(full) and adapter_rank(full) == 0
        assert set(base_weights(full)) == set(full.state_dict())
    finally:
        trainer.close()


def test_an_adapter_folder_is_refused_with_vllm_and_async_before_it_loads(adapter_dir, monkeypatch):
    monkeypatch.setattr("grpo.run.build.load_policy", _must_not_load)
    with pytest.raises(ConfigError, match="async_lag with --engine vllm and LoRA is not built"):
        _trainer(model=str(adapter_dir), engine="vllm", async_lag=1)


def test_an_adapter_folder_is_refused_with_vllm_under_fsdp_before_anything_launches(adapter_dir, monkeypatch,
                                                                                   capsys):
    monkeypatch.setattr("grpo.system.launcher.launch", _must_not_launch)
    monkeypatch.setattr("grpo.sampling.vllm_engine.find_python", lambda python="": "python")
    rc = cli_main(["train", "--model", str(adapter_dir), "--engine", "vllm", "--fsdp", "--nproc", "2",
                   "--steps", "1", "--no-preflight"])
    err = capsys.readouterr().err
    assert rc == 2 and "engine vllm with LoRA under FSDP is not built" in err and len(err.splitlines()) == 1


def _must_not_load(*args, **kwargs):
    raise AssertionError("the model was loaded before the refusal")


def _must_not_launch(*args, **kwargs):
    raise AssertionError("processes were launched before the refusal")


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def test_async_under_torchrun_is_refused_before_anything_launches_loads_or_forks(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("grpo.system.launcher.launch", _must_not_launch)
    monkeypatch.setattr("grpo.run.build.load_policy", _must_not_load)
    rc = cli_main(["train", "--nproc", "2", "--async-lag", "1", "--steps", "1", "--no-preflight",
                   "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "async_lag under torchrun is not built" in err and len(err.splitlines()) == 1
    # a launched rank (WORLD_SIZE set by torchrun) that reaches the trainer: refused before its reward workers fork
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("grpo.run.trainer.init_world", _must_not_load)
    before = len(_children())
    with pytest.raises(ConfigError, match="async_lag under torchrun is not built"):
        _trainer(async_lag=1, reward_workers=2)
    assert len(_children()) == before


def test_a_constructor_that_fails_ends_the_workers_it_forked(monkeypatch):
    def fail_to_load(*args, **kwargs):
        raise ConfigError("no such model (injected)")

    monkeypatch.setattr("grpo.run.build.load_policy", fail_to_load)
    before = len(_children())
    with pytest.raises(ConfigError, match="injected"):
        _trainer(reward_workers=2)  # the reward workers fork before the model loads
    assert len(_children()) == before, _children()


def test_an_adapter_runs_reference_is_its_base(adapter_dir):
    # as for --lora-rank: continuing grpo's own model/adapter keeps the reference its first run had
    from grpo.learning.logprobs import rollout_logprobs
    from grpo.learning.update import reference_logprobs
    from grpo.sampling.rounds import sample_batch

    trainer = _trainer(model=str(adapter_dir), beta=0.04)
    try:
        rollout = sample_batch(trainer.sampling, 1).rollout
        with torch.no_grad():
            policy, _ = rollout_logprobs(trainer.model, rollout, trainer.tokenizer.pad_token_id)
            with trainer.model.disable_adapter():
                base, _ = rollout_logprobs(trainer.model, rollout, trainer.tokenizer.pad_token_id)
        assert (policy - base).abs().max() > 1e-3  # the adapter changes the policy
        torch.testing.assert_close(reference_logprobs(trainer.learner, rollout), base)
    finally:
        trainer.close()
