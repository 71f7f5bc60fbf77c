"""--engine vllm on a GPU: the engine sleeps through the update and wakes before it is used again.

vLLM's CPU build has no sleep mode, so this checks the trainer-side protocol
with the worker's replies stubbed: what is sent, in which order.
"""

import re

import pytest
import torch

from grpo.sampling.vllm_engine import VLLMEngine


def _engine(sleep: bool) -> tuple[VLLMEngine, list]:
    sent = []
    engine = VLLMEngine.__new__(VLLMEngine)  # no worker process: _call records the requests
    engine.sleep_mode, engine.sleeping, engine.conn, engine.lora, engine.stops = sleep, [], object(), None, [2]
    engine.lora_rank, engine.versions, engine.dir, engine.woken = 0, 0, None, []
    engine.dtype, engine.bucket_bytes, engine.buffer = "float32", 1 << 20, None

    def call(message, **_):
        sent.append(message[0])
        if message[0] == "wake":
            engine.woken.append(message[1])
        return [([5, 2], [-0.1, -0.2], False)] if message[0] == "generate" else None

    engine._call = call
    return engine, sent


def test_the_engine_sleeps_once_through_the_update_and_wakes_before_the_next_request():
    engine, sent = _engine(sleep=True)
    engine.sleep()
    engine.sleep()  # already asleep: nothing sent
    assert sent == ["sleep"] and engine.asleep
    out = engine.sample([[1, 2, 3]], max_tokens=[4], drawn=[0], streams=torch.tensor([[1, 2]]))
    assert sent == ["sleep", "wake", "generate"] and not engine.asleep
    assert engine.woken == [["weights", "kv_cache"]]  # everything that sleeps, at once
    assert out == [([5, 2], [-0.1, -0.2], True)]  # the stop token 2 ended it


def test_without_sleep_mode_nothing_is_sent():
    engine, sent = _engine(sleep=False)
    engine.sleep()
    engine.sample([[1, 2, 3]], max_tokens=[4], drawn=[0])
    assert sent == ["generate"]


def test_a_push_wakes_the_engine_before_loading_the_weights(tmp_path):
    engine, sent = _engine(sleep=True)
    engine.dir = tmp_path
    engine.sleep()
    engine.push(torch.nn.Linear(2, 2))
    # the weights wake first and take the new ones; the KV cache after, alone (tags=None would wake the
    # weights again, vLLM's default being every tag)
    assert sent == ["sleep", "wake", "load_bucket", "weights_loaded", "wake"] and not engine.asleep
    assert engine.woken == [["weights"], ["kv_cache"]]
    engine.sample([[1, 2, 3]], max_tokens=[4], drawn=[0])  # all awake: the request wakes nothing
    assert sent[-1] == "generate" and len(engine.woken) == 2


def test_a_lora_push_wakes_everything_at_once(tmp_path):
    # LoRA loads no weights into vLLM's model: the adapter comes with the next request
    engine, sent = _engine(sleep=True)
    engine.dir, engine.lora_rank = tmp_path, 8
    engine.sleep()
    engine.push(type("Adapter", (), {"save_pretrained": lambda self, folder: None})())
    assert sent == ["sleep", "wake"] and engine.woken == [["weights", "kv_cache"]] and not engine.asleep


class Recorder:
    """Stands in for the vLLM engine in a trainer: samples on the policy itself and records the calls."""

    def __init__(self, trainer):
        self.trainer, self.events, self.asleep = trainer, [], False

    def generate(self, prompts, **sampling):
        from grpo.sampling.rollout import generate

        self.events.append("generate")
        with torch.no_grad():
            return generate(self.trainer.model, self.trainer.tokenizer, prompts, **sampling)

    def sleep(self):
        self.events.append("sleep")
        self.asleep = True

    def push(self, model, state=None):
        self.events.append("push")
        self.asleep = False
        return 0.0

    def close(self):
        pass


def test_the_trainer_sleeps_the_engine_after_sampling_and_pushes_after_the_update():
    from conftest import make_model, make_tokenizer

    from grpo.config import TrainConfig
    from grpo.run.build import resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer
    from grpo.tasks import Task

    tokenizer = make_tokenizer()
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(20)]
    config = TrainConfig(preflight="off", eval_every=-1, sampler="uniform", filter_groups=False, prompts_per_step=4,
                         group_size=4, max_new_tokens=6, lr=1e-2, warmup_steps=0, sample_every=0, device="cpu",
                         save_model=False, reward_workers=0)
    reward = lambda completion, example: float(ord(completion[0]) % 2) if completion else 0.5  # noqa: E731
    setup_process(config)
    model = make_model(len(tokenizer), seed=3)
    run = resolve_run(config, task=Task("tiny", rows[:16], rows[16:], reward), model=model)
    trainer = GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)
    engine = trainer.sampling.generation.engine = Recorder(trainer)  # the sampling side (grpo/sampling/step_parts.py) holds the engine
    m = trainer.step(1)
    assert m["optimizer_steps"] == 1
    events = engine.events
    assert events[-2:] == ["sleep", "push"] and set(events[:-2]) == {"generate"}, events
    # the gradients were freed before the engine woke for the push (their memory goes back to it)
    assert all(p.grad is None for p in trainer.model.parameters())


def test_seeds_are_drawn_on_the_generators_own_device(monkeypatch):
    # on a GPU the pre-flight check's generator is a CUDA one (preflight.py builds it on the trainer's
    # device), and a CUDA generator cannot draw a CPU tensor; this CPU build has no CUDA generator, so a
    # stand-in checks the rule torch applies there
    from types import SimpleNamespace

    cuda = SimpleNamespace(device=torch.device("cuda", 0))

    def randint(low, high, size, *, generator=None, device=None):
        if generator is not None and torch.device(device or "cpu") != generator.device:
            raise RuntimeError(f"Expected a '{torch.device(device or 'cpu').type}' device type for generator")
        return torch.arange(size[0])

    monkeypatch.setattr(torch, "randint", randint)
    engine, sent = _engine(sleep=False)
    engine.sample([[1, 2, 3]], max_tokens=[4], drawn=[0], generator=cuda)
    assert sent == ["generate"]


def test_a_start_past_its_deadline_fails_with_the_log_named(tmp_path):
    import time
    from multiprocessing import Pipe

    from grpo.sampling.vllm_engine import EngineError
    from grpo.sampling.vllm_process import START_SECONDS

    # below NCCL's default collective timeout (600 s), so a slow start fails here, not as a hung collective
    assert START_SECONDS["cuda"] < 600
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.conn, _silent = Pipe()  # the worker never answers
    engine.proc = type("Alive", (), {"poll": lambda self: None})()
    engine.cuda_device, engine.log, engine.failed = 0, tmp_path / "vllm.log", False
    with pytest.raises(EngineError, match=r"did not start in 480 s \(log: .*vllm.log\)"):
        engine._call({"model": "m"}, deadline=time.monotonic() + 1.5)
    assert engine.failed  # the log is kept


def _starting(tmp_path, monkeypatch, announce: bool, ready: bool) -> VLLMEngine:
    """An engine whose start() runs with no worker: nothing written, no process, the worker's replies
    stubbed (ready, or past its deadline)."""
    import grpo.sampling.vllm_engine as ve

    for name in ("_write_model", "_shutdown"):  # no model files; no process group to end
        monkeypatch.setattr(ve, name, lambda *a: None)
    monkeypatch.setattr(ve, "base_weights", lambda *a: {})  # no weights: nothing to check room for
    monkeypatch.setattr(ve.subprocess, "Popen", lambda *a, **k: type("Worker", (), {"pid": -1})())
    engine = VLLMEngine.__new__(VLLMEngine)
    engine._say = print if announce else lambda text, **_: None
    engine.cuda_device, engine.lora_rank, engine.log, engine.dir = None, 0, tmp_path / "vllm.log", tmp_path
    engine._model = engine._state = None
    engine.tokenizer = type("Tokenizer", (), {"save_pretrained": lambda self, folder: None})()
    engine.python, engine.cpus, engine._finalizer = "python", "", type("Finalizer", (), {"detach": lambda self: None})()
    engine.dtype, engine.seed, engine.memory, engine.max_model_len = "float32", 0, 0.1, 64
    engine.sleep_mode, engine.extra, engine.failed = False, {}, False
    engine._connect = lambda address, key, deadline: object()
    engine._call = (lambda message, **_: None) if ready else lambda message, **_: (_ for _ in ()).throw(
        ve.EngineError(engine._too_slow()))
    return engine


def test_the_start_says_it_may_take_minutes_its_limit_and_log_then_when_it_is_ready(tmp_path, monkeypatch, capsys):
    from grpo.sampling.vllm_engine import EngineError
    from grpo.sampling.vllm_process import START_SECONDS

    _starting(tmp_path, monkeypatch, announce=True, ready=True).start()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"vLLM: starting, which may take minutes (limit {START_SECONDS['cpu']} s; "
                      f"log: {tmp_path / 'vllm.log'})")
    assert len(out) == 2 and re.fullmatch(r"vLLM: ready in \d+ s", out[1])
    with pytest.raises(EngineError, match="did not start in 900 s"):  # the start line came before the error
        _starting(tmp_path, monkeypatch, announce=True, ready=False).start()
    assert capsys.readouterr().out.startswith("vLLM: starting")
    _starting(tmp_path, monkeypatch, announce=False, ready=True).start()  # another rank's engine: silent
    assert capsys.readouterr().out == ""


def test_a_full_push_sends_every_weight_through_one_shared_buffer_a_layer_never_split(tmp_path):
    """The trainer's side of a push: each bucket is read back from the shared buffer, as the worker maps
    it, when its message is sent; every weight arrives whole, in the engine's dtype, tied ones under both
    names, a decoder layer in one bucket; the buffer is one file, kept, of one bucket's size."""
    from conftest import make_model

    engine, sent = _engine(sleep=False)
    engine.dir, engine.dtype = tmp_path, "bfloat16"
    model = make_model(40, layers=3, hidden=32)
    state = model.state_dict()
    layer_bytes = sum(v.numel() * 2 for k, v in state.items() if k.startswith("model.layers.0."))
    engine.bucket_bytes = layer_bytes + 1  # room for one layer, not two
    arrived, buckets = {}, []

    def call(message, **_):
        sent.append(message[0])
        if message[0] == "load_bucket":
            _, path, size, dtype, entries = message
            data = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            buckets.append([name for name, _, _ in entries])
            for name, shape, offset in entries:
                n = torch.Size(shape).numel() * 2
                arrived[name] = data[offset:offset + n].view(getattr(torch, dtype)).view(shape).clone()

    engine._call = call
    for _ in range(2):  # new values at the second push: stale bytes from the first would show
        buckets.clear()
        engine.push(model)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.5)
    state = {k: v - 0.5 for k, v in model.state_dict().items()}  # what the second push sent (a tied weight once)
    assert set(arrived) == set(state) and "lm_head.weight" in arrived
    for name, value in state.items():
        assert arrived[name].dtype == torch.bfloat16 and torch.equal(arrived[name], value.to(torch.bfloat16)), name
    layers = [{k.split(".")[2] for k in b if k.startswith("model.layers.")} for b in buckets]
    assert [len(ls) for ls in layers if ls] == [1, 1, 1], buckets  # a layer a bucket, never split
    assert sent.count("weights_loaded") == 2 and sent.count("load_bucket") == 2 * len(buckets)
    assert [p.name for p in tmp_path.iterdir()] == ["weights.bin"]
    assert engine.buffer.numel() == max(sum(state[k].numel() * 2 for k in b) for b in buckets)
    assert engine.pushed_bytes == sum(v.numel() * 2 for v in state.values())


def test_weight_buckets_keep_each_block_and_each_module_whole():
    from grpo.sampling.vllm_weights import weight_buckets

    names = ["model.embed_tokens.weight", "model.layers.1.q.weight", "model.layers.1.mlp.experts.0.w",
             "model.layers.1.mlp.experts.1.w", "model.layers.10.q.weight", "model.layers.10.k.weight",
             "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
             "model.norm.weight", "model.norm.bias", "lm_head.weight"]
    sizes = dict.fromkeys(names, 10)
    assert weight_buckets(sizes, 1) == [
        ["model.embed_tokens.weight"], names[1:4], names[4:6], names[6:8], ["model.norm.weight", "model.norm.bias"],
        ["lm_head.weight"]]  # layers 1 and 10 apart, experts with their layer, a module's weight and bias together
    assert weight_buckets(sizes, 40) == [names[:4], names[4:8], names[8:]]  # whole blocks, up to the limit
    assert weight_buckets(sizes, 10**6) == [names]
