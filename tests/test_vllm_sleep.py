"""--engine vllm on a GPU: the engine sleeps through the update and wakes before it is used again.

vLLM's CPU build has no sleep mode, so this checks the trainer-side protocol
with the worker's replies stubbed: what is sent, in which order.
"""

import torch

from grpo.vllm_engine import VLLMEngine


def _engine(sleep: bool) -> tuple[VLLMEngine, list]:
    sent = []
    engine = VLLMEngine.__new__(VLLMEngine)  # no worker process: _call records the requests
    engine.sleep_mode, engine.asleep, engine.conn, engine.lora, engine.stops = sleep, False, object(), None, [2]
    engine.lora_rank, engine.versions, engine.dir = 0, 0, None

    def call(message, **_):
        sent.append(message[0])
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
    assert sent == ["sleep", "wake", "load_weights"] and not engine.asleep
