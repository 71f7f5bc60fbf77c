"""A learned reward: a Hugging Face ``AutoModelForSequenceClassification`` folder.

It scores the prompt and the completion together (rendered by the reward
model's chat template when it has one, else joined by a newline); the score
is the logit of a single-output head, or the logit of the last class of a
multi-class head (the "good" class by convention).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch


class RewardModel:
    """Callable like any reward, and batched through ``score_batch`` by the scorer."""

    def __init__(self, folder: str | Path, *, device: str = "cpu", batch_size: int = 16, max_length: int = 2048) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.folder = Path(folder)
        self.__name__ = f"rm_{self.folder.name}"
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(self.folder).to(device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device, self.batch_size, self.max_length = device, batch_size, max_length

    def _text(self, completion: str, example: Mapping) -> str:
        prompt = str(example.get("prompt", ""))
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return f"{prompt}\n{completion}"

    @torch.no_grad()
    def score_batch(self, completions: Sequence[str], rows: Sequence[Mapping]) -> list[float]:
        scores: list[float] = []
        texts = [self._text(c, r) for c, r in zip(completions, rows, strict=True)]
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[i : i + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length).to(self.device)
            logits = self.model(**enc).logits.float()  # (b, classes)
            scores.extend(logits[:, -1].tolist())
        return scores

    def __call__(self, completion: str, example: Mapping) -> float:
        return self.score_batch([completion], [example])[0]
