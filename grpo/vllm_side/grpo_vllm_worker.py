"""The vLLM side of ``--engine vllm``: a process that holds a vLLM engine and answers the trainer.

It runs under vLLM's own Python (``make vllm`` builds ``.venv-vllm``), so it
imports nothing of grpo: only the standard library, vLLM and torch. The trainer (grpo/sampling/vllm_engine.py) starts it as
``python grpo_vllm_worker.py ADDRESS``, with the connection's key in
``GRPO_VLLM_AUTHKEY``; it listens on that Unix socket for the trainer,
receives the engine's settings, and then serves requests, one at a time, until told to close:

- ``("generate", requests, lora)``: sample each request (prompt ids and
  sampling settings, one completion each) and return, per request, the
  tokens, their log-probs and whether it hit its token limit;
- ``("score", rows, lora)``: the log-probs of given completions after their
  prompts (temperature 1), to check that the engine holds the trainer's weights;
- ``("load_bucket", path, size, dtype, entries)``: load a bucket of full
  weights into the model in place, from the shared-memory buffer at ``path``
  (``size`` bytes, mapped once for the run), each entry a name, a shape and a
  byte offset in the engine's ``dtype``; ``("weights_loaded",)`` after the
  last bucket drops the prefix cache;
- ``("sleep", level)`` and ``("wake", tags)``: vLLM's sleep mode (CUDA),
  which frees the engine's device memory while the trainer updates (tags:
  ["weights"] before a push loads new weights, ["kv_cache"] after it, both
  before a request that finds them asleep);
- ``("close",)``.

Every reply is ``("ok", value)`` or ``("error", kind, message)``; a start-up
failure is reported as the first reply, so the trainer can say what to do.
The class ``WeightLoader`` is vLLM's worker extension: vLLM imports it in the
process that holds the model (this file's folder is on that process's path).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Listener


class WeightLoader:
    """Mixed into vLLM's worker: methods the engine calls through ``collective_rpc``."""

    def grpo_load_bucket(self, path: str, size: int, dtype: str, entries: list) -> int:
        import logging

        import torch

        # a bucket loads part of the model: vLLM's in-place reload logs every module it did not load, at
        # every bucket of every push, which would grow the log without end
        for name in ("vllm.model_executor.model_loader.reload.layerwise", "vllm.model_executor.model_loader.reload.inplace"):
            logging.getLogger(name).setLevel(logging.ERROR)

        buffer = getattr(self, "_grpo_buffer", None)
        if buffer is None or buffer[0] != (path, size):  # mapped once, while the trainer keeps its size
            buffer = self._grpo_buffer = ((path, size), torch.from_file(path, shared=True, size=size,
                                                                        dtype=torch.uint8))
        data, kind = buffer[1], getattr(torch, dtype)
        weights = [(name, data[offset:offset + math.prod(shape) * kind.itemsize].view(kind).view(shape))
                   for name, shape, offset in entries]
        # vLLM's in-place reload: a plain load_weights fails once the backend has repacked its layers
        # (the CPU backend's linear weights are emptied into a kernel format after loading). It copies
        # the views into the model's own tensors before the trainer writes the next bucket.
        self.reload_weights(weights_iterator=iter(weights))
        return len(weights)


def _error_kind(err: BaseException) -> str:
    text = str(err).lower()
    if isinstance(err, MemoryError) or "memory" in text or "kv cache" in text or "out of memory" in text:
        return "memory"
    if isinstance(err, (ValueError, TypeError)):
        return "option"
    return "other"


def engine_options(settings: dict) -> dict:
    """The keyword arguments of vLLM's ``LLM`` for the trainer's ``settings``.

    ``processed_logprobs``: each sampled token's log-prob under the distribution it was drawn from, after
    temperature, top-k and top-p (renormalised over the kept tokens), the one definition of the sampler's
    log-prob that the own engine records too (grpo/sampling/next_token.py ``sample_next``; docs/sampler-logprobs.md).
    """
    kwargs = dict(
        model=settings["model"], tokenizer=settings["model"], dtype=settings["dtype"], seed=settings["seed"],
        gpu_memory_utilization=settings["memory"], enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        worker_extension_cls="grpo_vllm_worker.WeightLoader", max_model_len=settings["max_model_len"],
    )
    if settings.get("cpu", True):
        # every prompt of a batch prefilled in one step: vLLM rewinds the random generator of a request whose
        # prefill was split across steps, which its CPU generators cannot do ("does not use offset"); not on
        # a GPU, where it would make vLLM profile a 65k-token forward and leave little room for its KV cache
        kwargs["max_num_batched_tokens"] = 65536
    if settings["lora_rank"]:
        kwargs.update(enable_lora=True, max_lora_rank=settings["lora_rank"], max_loras=1)
    if settings.get("sleep"):
        kwargs["enable_sleep_mode"] = True
    return {**kwargs, **settings.get("extra", {})}


def _start(settings: dict) -> object:
    from vllm import LLM

    return LLM(**engine_options(settings))


def sampling_options(request: dict) -> dict:
    """The keyword arguments of vLLM's ``SamplingParams`` for one request: one completion, its top-k/top-p
    applied by vLLM's sampler (so the processed log-prob is that of the truncated distribution)."""
    return dict(
        n=1, temperature=request["temperature"], top_p=request["top_p"], top_k=request["top_k"] or -1,
        max_tokens=request["max_tokens"], seed=request["seed"], stop=list(request["stop"]) or None,
        include_stop_str_in_output=True, stop_token_ids=request["stop_token_ids"],
        ignore_eos=not request["stop_token_ids"], logprobs=0, detokenize=bool(request["stop"]),
    )


def _generate(llm: object, requests: list[dict], lora: tuple[str, int, str] | None) -> list[tuple]:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    prompts, params = [], []
    for r in requests:
        prompts.append({"prompt_token_ids": r["prompt"]})
        params.append(SamplingParams(**sampling_options(r)))
    request = LoRARequest(*lora) if lora else None
    outputs = llm.generate(prompts, params, lora_request=request, use_tqdm=False)
    results = []
    for out in outputs:
        done = out.outputs[0]
        tokens = list(done.token_ids)
        logprobs = [step[t].logprob for step, t in zip(done.logprobs, tokens, strict=True)]
        results.append((tokens, logprobs, done.finish_reason == "length"))
    return results


def _score(llm: object, rows: list[tuple[list[int], list[int]]], lora: tuple[str, int, str] | None) -> list[list[float]]:
    """Each completion's log-probs after its prompt, at temperature 1 (vLLM's prompt log-probs)."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    prompts = [{"prompt_token_ids": list(p) + list(c)} for p, c in rows]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    request = LoRARequest(*lora) if lora else None
    if request is None:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    else:  # one prompt a call: vLLM's CPU LoRA path failed on prompt log-probs of several requests in one
        # batch (einsum: "subscript b has size 2 ... previously seen size 30", the requests against the tokens)
        outputs = [llm.generate([p], params, lora_request=request, use_tqdm=False)[0] for p in prompts]
    scores = []
    for (prompt, completion), out in zip(rows, outputs, strict=True):
        ids = list(prompt) + list(completion)
        steps = out.prompt_logprobs[len(prompt):]  # entry t: the log-prob of token t given the tokens before it
        scores.append([step[t].logprob for step, t in zip(steps, ids[len(prompt):], strict=True)])
    return scores


def serve(conn: object) -> None:
    settings = conn.recv()
    try:
        llm = _start(settings)
    except BaseException as err:  # every start-up failure goes back to the trainer as one line
        conn.send(("error", _error_kind(err), f"{type(err).__name__}: {err}"))
        return
    conn.send(("ok", None))
    loaded_lora: int | None = None
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the trainer is gone (its socket closed when it ended): end with it
            return
        try:
            if message[0] == "close":
                conn.send(("ok", None))
                return
            if message[0] in ("generate", "score"):
                lora = message[2]
                if lora and loaded_lora is not None and loaded_lora != lora[1]:
                    llm.llm_engine.remove_lora(loaded_lora)  # the old adapter version is never used again
                loaded_lora = lora[1] if lora else loaded_lora
                run = _generate if message[0] == "generate" else _score
                conn.send(("ok", run(llm, message[1], lora)))
            elif message[0] == "sleep":
                llm.sleep(level=message[1])
                conn.send(("ok", None))
            elif message[0] == "wake":
                llm.wake_up(tags=message[1])
                conn.send(("ok", None))
            elif message[0] == "load_bucket":
                start = time.perf_counter()
                llm.collective_rpc("grpo_load_bucket", args=tuple(message[1:]))
                conn.send(("ok", time.perf_counter() - start))
            elif message[0] == "weights_loaded":
                llm.reset_prefix_cache()  # cached keys and values were computed with the old weights
                conn.send(("ok", None))
            else:
                conn.send(("error", "other", f"unknown request {message[0]!r}"))
        except Exception as err:  # reported to the trainer, which stops with it
            conn.send(("error", _error_kind(err), f"{type(err).__name__}: {err}"))


def end_with_trainer(trainer: int, every: float = 0.5) -> None:
    """Kill this process group (the worker and vLLM's engine processes) once the trainer is gone, however it
    ended: a trainer killed outright (SIGKILL) runs no clean-up, and our parent becomes another process."""
    while os.getppid() == trainer:
        time.sleep(every)
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    key = bytes.fromhex(os.environ.pop("GRPO_VLLM_AUTHKEY"))  # not inherited by vLLM's own processes
    trainer = int(os.environ.pop("GRPO_VLLM_TRAINER", os.getppid()))  # its pid, taken before it started us
    threading.Thread(target=end_with_trainer, args=(trainer,), daemon=True, name="end-with-trainer").start()
    with Listener(sys.argv[1], family="AF_UNIX", authkey=key) as listener, listener.accept() as conn:
        serve(conn)


if __name__ == "__main__":  # vLLM's engine starts its processes by spawn, which imports this file again
    main()
