def score(completion: str, example: dict) -> float:
    """1.0 when the reply is exactly the row's answer (surrounding spaces aside), else 0.0."""
    return float(completion.strip() == example["answer"])
