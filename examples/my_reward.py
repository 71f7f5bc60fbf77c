import re


def score(completion: str, example: dict) -> float:
    """1.0 when the reply's last number is the row's answer and the reply was not cut off, else 0.0."""
    numbers = re.findall(r"-?\d+", completion)
    return float(bool(numbers) and numbers[-1] == example["answer"] and not example.get("truncated"))
