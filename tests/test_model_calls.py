"""The policy's no-grad gathers (grpo/system/distributed.py, ModelCalls.gathered), with stand-in FSDP units.

FSDP itself needs a process group; here the units only record what is done to them, in order, so the
test sees the gathers, the reshards in the ``finally`` (a body that raises included), the settings of
reshard_after_forward put back (layers on, root off, as shard_policy leaves them), and the root's one
empty call, which settles FSDP's root before any layer runs.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.fsdp
from torch import nn

from grpo.system.distributed import ModelCalls


class Unit:
    """What ModelCalls.gathered calls of an FSDP unit, recorded in one log shared by all units."""

    log: list[tuple[str, str, object]]
    unit_name: str

    def set_reshard_after_forward(self, value: bool, recurse: bool = True) -> None:
        assert recurse is False
        self.log.append(("set_reshard_after_forward", self.unit_name, value))

    def unshard(self) -> None:
        self.log.append(("unshard", self.unit_name, None))

    def reshard(self) -> None:
        self.log.append(("reshard", self.unit_name, None))


class Layer(nn.Linear, Unit):
    pass


class Root(ModelCalls, Unit):
    pass


@pytest.fixture
def policy(monkeypatch):
    monkeypatch.setattr(torch.distributed.fsdp, "FSDPModule", Unit)
    log: list = []
    model = nn.Sequential(Layer(2, 2), Layer(2, 2))
    root = Root(model)
    for name, unit in (("layer0", model[0]), ("layer1", model[1]), ("root", root)):
        unit.log, unit.unit_name = log, name
    root.register_forward_pre_hook(lambda module, args: log.append(("root forward", "root", None)))
    return root, log


def test_every_unit_is_gathered_for_the_body_and_resharded_after(policy):
    root, log = policy
    with root.gathered() as model:
        assert model is root.model and not torch.is_grad_enabled()
        log.append(("body", "", None))
    assert torch.is_grad_enabled()
    order = [(what, who) for what, who, _ in log if what != "set_reshard_after_forward"]
    assert order == [("unshard", "root"), ("unshard", "layer0"), ("unshard", "layer1"), ("root forward", "root"),
                     ("body", ""), ("reshard", "root"), ("reshard", "layer0"), ("reshard", "layer1")]
    settings = [(who, value) for what, who, value in log if what == "set_reshard_after_forward"]
    assert settings[:3] == [("root", False), ("layer0", False), ("layer1", False)]  # held for the body
    assert settings[3:] == [("root", False), ("layer0", True), ("layer1", True)]  # as shard_policy leaves them


def test_a_body_that_raises_still_reshards_every_unit(policy):
    root, log = policy
    with pytest.raises(RuntimeError, match="out of memory"), root.gathered():
        raise RuntimeError("out of memory")
    assert torch.is_grad_enabled()
    assert [who for what, who, _ in log if what == "reshard"] == ["root", "layer0", "layer1"]
    assert [(who, value) for what, who, value in log if what == "set_reshard_after_forward"][3:] == [
        ("root", False), ("layer0", True), ("layer1", True)]


def test_joining_the_gathers_gathers_and_reshards_with_nothing_to_do(policy):
    root, log = policy
    root.join_gathers()
    assert [who for what, who, _ in log if what == "unshard"] == ["root", "layer0", "layer1"]
    assert [who for what, who, _ in log if what == "reshard"] == ["root", "layer0", "layer1"]


def test_without_fsdp_it_is_a_plain_no_grad_call():
    model = nn.Linear(2, 2)
    with ModelCalls(model).gathered() as inside:
        assert inside is model and not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
