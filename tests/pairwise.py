"""All-pairs cases: a small greedy generator of combinations in which every pair of values of two axes
appears in at least one case (pairwise testing), the combinations that ``allowed`` refuses left out.

Pure: the same axes give the same cases. Greedy (as AETG and PICT build theirs): each new case starts from
the first pair not yet covered and gives every other axis the value that covers the most uncovered pairs
with the values already chosen, the first such value on a tie. Not the fewest cases there could be, but
close on small axes, and every pair is checked (``uncovered``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations

Pair = tuple[tuple[str, object], tuple[str, object]]


def all_pairs_of(axes: Mapping[str, Sequence]) -> list[Pair]:
    """Every pair ((a, x), (b, y)) of values of two axes a before b, in the axes' order."""
    return [((a, x), (b, y)) for a, b in combinations(axes, 2) for x in axes[a] for y in axes[b]]


def pairs_in(case: Mapping[str, object], axes: Mapping[str, Sequence]) -> set[Pair]:
    """The pairs a (possibly partial) case holds."""
    names = [a for a in axes if a in case]
    return {((a, case[a]), (b, case[b])) for a, b in combinations(names, 2)}


def uncovered(cases: Sequence[Mapping], axes: Mapping[str, Sequence],
              allowed: Callable[[Mapping], bool] = lambda case: True) -> list[Pair]:
    """The pairs no case holds, of those an allowed case could hold."""
    held = set().union(*(pairs_in(c, axes) for c in cases)) if cases else set()
    return [p for p in all_pairs_of(axes) if p not in held and allowed(dict(p))]


def pairwise(axes: Mapping[str, Sequence], allowed: Callable[[Mapping], bool] = lambda case: True) -> list[dict]:
    """Cases covering every pair of values that ``allowed`` accepts (``allowed`` is asked of partial cases,
    and must say False only for a conflict among the values it is given)."""
    left = set(uncovered([], axes, allowed))
    cases = []
    while left:
        first = next(p for p in all_pairs_of(axes) if p in left)
        case = dict(first)
        for axis in axes:
            if axis not in case:
                case[axis] = _best_value(case, axis, axes, left, allowed)
        cases.append({axis: case[axis] for axis in axes})
        left -= pairs_in(case, axes)
    return cases


def _best_value(case: dict, axis: str, axes: Mapping[str, Sequence], left: set[Pair],
                allowed: Callable[[Mapping], bool]) -> object:
    """The allowed value of ``axis`` that covers the most uncovered pairs with the case's values so far."""
    scores = {}
    for value in axes[axis]:
        trial = {**case, axis: value}
        if allowed(trial):
            scores[value] = len(pairs_in(trial, axes) & left)
    if not scores:
        raise ValueError(f"no value of {axis} is allowed with {case}")
    return max(scores, key=scores.get)  # max keeps the first of equal scores
