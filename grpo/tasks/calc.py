"""``calc``: arithmetic the model cannot do in its head, with a calculator tool it can learn to call.

"What is 4721 * 38 + 517?": a 3-4 digit times a 2-3 digit factor, plus a
3-digit term. The prompt opens with one example exchange (a bare product, a
calculator call, its result, the answer). The embedded SmolLM2-135M copies
that exchange almost perfectly for a bare product (measured: 87.5% of 64
held-out products right greedily before any training), which leaves nothing to
learn; with the added term it rarely calls the calculator with the whole
expression (1.2% of 256 held-out right greedily, 0.8% of 128 samples at
temperature 0.7 in the pre-flight check, 6% of groups mixed), so the skill
GRPO has to find is writing one complete call, with signal from the first
step. Without the example (the tools described in
the system message alone) no sample of 128 called the calculator: no signal.
The reward is 1 when the last turn's final number is the value.
``--tools none`` withholds the calculator (its calls get an error), the
control run: the same prompts, no way to the answer.
"""

from __future__ import annotations

import ast
import operator
import random

from grpo.rewards.basic import final_number
from grpo.tasks.base import Task

_SPLIT_SEED = 1234
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_DIGITS = 100  # a result or operand larger than this is refused (no 9**9**9)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: the arithmetic to do, for example "4721 * 38"
    """
    tree = ast.parse(expression.strip(), mode="eval")  # parsed, never eval'd: only numbers and operators
    value = _value(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 10) if isinstance(value, float) else value)


def _value(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        inner = _value(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) * len(str(int(abs(left)) or 1)) > _MAX_DIGITS:
            raise ValueError("the result would be too large")
        result = _OPS[type(node.op)](left, right)
        if abs(result) >= 10**_MAX_DIGITS:
            raise ValueError("the result is too large")
        return result
    raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")


SYSTEM_PROMPT = "You are a helpful assistant. Use the calculator for arithmetic, then answer with only the number."
EXAMPLE = [
    {"role": "user", "content": "What is 4721 * 38?"},
    {"role": "assistant", "content": '<tool>calculator("4721 * 38")</tool>'},
    {"role": "tool", "content": "179398"},
    {"role": "assistant", "content": "179398"},
]


def _row(a: int, b: int, c: int) -> dict:
    question = f"What is {a} * {b} + {c}?"
    return {"prompt": [*EXAMPLE, {"role": "user", "content": question}], "answer": str(a * b + c),
            "question": question}


def calc_reward(completion: str, example: dict) -> float:
    """1.0 when the last turn's final number is the value (final_number, with the question as the prompt)."""
    return final_number(completion, {**example, "prompt": example["question"]})


def calc(heldout_size: int = 256) -> Task:
    """a * b + c with a of 3-4 digits, b of 2-3 and c of 3, a calculator tool to call (3,000 problems)."""
    rng = random.Random(_SPLIT_SEED)
    triples: set[tuple[int, int, int]] = set()
    while len(triples) < 3000:
        triples.add((rng.randrange(100, 10000), rng.randrange(10, 1000), rng.randrange(100, 1000)))
    rows = [_row(a, b, c) for a, b, c in sorted(triples)]
    rng.shuffle(rows)
    return Task(
        "calc", rows[heldout_size:], rows[:heldout_size], calc_reward, SYSTEM_PROMPT,
        # a call is about 20 tokens, the answer under 10: the call and, after its result, the answer are
        # 2 turns; a third turn (after an error) rarely rescued an episode and cost the most tokens
        # episodes make a step slow on a CPU (about 80 s): a time budget, as a run on --data has
        defaults={"max_new_tokens": 32, "max_turns": 2, "steps": 100, "minutes": 10.0},
        tools=(calculator,),
    )
