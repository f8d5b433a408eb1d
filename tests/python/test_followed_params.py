"""DMuon follows parameters, not parameter objects: names, matrix views (GPT-2's transposed
Conv1D, nn.MultiheadAttention's q, k, v, expert stacks) and routing reasons survive a
replacement of every parameter object that keeps the module's structure (Accelerate's
FSDP2 prepare puts fresh nn.Parameter objects into the module and into param_groups), and
the state follows them; a place whose new tensor does not fit raises naming it. Reference:
the same run without the replacement, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import dmuon
from contract_models import MoEModel, TinyGPT2, TinyViT
from dist_harness import run_distributed


def replace_parameters(model: nn.Module, opt: torch.optim.Optimizer) -> dict[int, nn.Parameter]:
    """A fresh nn.Parameter copy of every parameter, in the module and in the optimizer's
    param_groups (Accelerate's fsdp2_switch_optimizer_parameters); old id → new."""
    fresh: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in fresh:
                    fresh[id(p)] = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                module._parameters[name] = fresh[id(p)]
    for group in opt.param_groups:
        group["params"] = [fresh[id(p)] for p in group["params"]]
    return fresh


def gpt2_loss(model: nn.Module, step: int) -> torch.Tensor:
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(step))
    return model(ids).square().mean()


def vit_loss(model: nn.Module, step: int) -> torch.Tensor:
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(step))
    return model(images).square().mean()


def moe_loss(model: nn.Module, step: int) -> torch.Tensor:
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step))
    h = torch.einsum("td,egd->etg", x, model.moe.gate_up).relu()[..., :12]
    y = torch.einsum("etg,edg->td", h, model.moe.down)
    return (y.square().mean() + model.router(x).square().mean() + model.bias.tables.square().mean())


CASES = {
    # NOTE: GPT-2's options of the issue's reproducer (presets.torch_muon): adjust_lr="original"
    # makes the Conv1D's transposition change its lr ratio.
    "gpt2_conv1d": (lambda: TinyGPT2(dim=64), gpt2_loss,
                    dict(lr=1e-2, math=dmuon.MuonMath(momentum=0.0, nesterov=False, adjust_lr="original"))),
    "mha_in_proj": (TinyViT, vit_loss, dict(lr=1e-2)),
    "expert_stack": (MoEModel, moe_loss, dict(lr=1e-2)),
}


def train(model: nn.Module, opt: dmuon.DMuon, loss_fn, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        loss_fn(model, step).backward()
        opt.step()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("replace_after", [0, 1], ids=["fresh", "after_a_step"])
def test_replaced_parameters_step_as_the_originals(case, replace_after):
    make, loss_fn, options = CASES[case]
    torch.manual_seed(0)
    plain = make()
    swapped = copy.deepcopy(plain)
    plain_opt, swapped_opt = dmuon.DMuon(plain, **options), dmuon.DMuon(swapped, **options)
    names = {n: swapped_opt.param_name(p) for n, p in swapped.named_parameters()}
    views = {n: swapped_opt.matrix_view(p) for n, p in swapped.named_parameters()}
    train(plain, plain_opt, loss_fn, range(3))
    train(swapped, swapped_opt, loss_fn, range(replace_after))
    replace_parameters(swapped, swapped_opt)
    assert {n: swapped_opt.param_name(p) for n, p in swapped.named_parameters()} == names
    assert {n: swapped_opt.matrix_view(p) for n, p in swapped.named_parameters()} == views
    assert "<unnamed>" not in str(swapped_opt.routing_summary())
    train(swapped, swapped_opt, loss_fn, range(replace_after, 3))
    for (name, a), b in zip(swapped.named_parameters(), plain.parameters()):
        assert torch.equal(a, b), name
    # The state moved to the new objects (a step after the replacement read it: equal above).
    assert all(p in swapped_opt.state for g in swapped_opt.param_groups for p in g["params"])


def test_load_state_dict_with_assign_then_repointed_groups_steps_as_the_original():
    """load_state_dict(..., assign=True) puts new parameter objects into the module; the
    caller re-points param_groups at them by name (as for any torch optimizer)."""
    torch.manual_seed(0)
    plain = TinyGPT2(dim=64)
    assigned = copy.deepcopy(plain)
    options = CASES["gpt2_conv1d"][2]
    plain_opt, assigned_opt = dmuon.DMuon(plain, **options), dmuon.DMuon(assigned, **options)
    train(plain, plain_opt, gpt2_loss, range(2))
    train(assigned, assigned_opt, gpt2_loss, range(1))
    name_of = {id(p): n for n, p in assigned.named_parameters()}
    assigned.load_state_dict({k: v.clone() for k, v in assigned.state_dict().items()}, assign=True)
    assigned.lm_head.weight = assigned.wte.weight  # NOTE: assign=True unties them (HF: tie_weights())
    new = dict(assigned.named_parameters())
    for group in assigned_opt.param_groups:
        group["params"] = [new[name_of[id(p)]] for p in group["params"]]
    train(assigned, assigned_opt, gpt2_loss, range(1, 2))
    for (name, a), b in zip(assigned.named_parameters(), plain.parameters()):
        assert torch.equal(a, b), name


def test_the_views_that_must_survive_are_the_routed_ones():
    """What the cases above keep: the transposed Conv1D and MHA's three row blocks."""
    gpt2, vit = TinyGPT2(dim=64), TinyViT()
    assert dmuon.DMuon(gpt2).matrix_view(gpt2.c_fc.weight).transposed
    assert len(dmuon.DMuon(vit).matrix_view(vit.attn.in_proj_weight).row_blocks) == 3


def test_a_replacement_that_does_not_fit_its_place_is_refused_by_name():
    model = TinyGPT2(dim=16)
    opt = dmuon.DMuon(model)
    group = next(g for g in opt.param_groups if g["use_muon"])
    idx = next(i for i, p in enumerate(group["params"]) if p is model.c_fc.weight)
    group["params"][idx] = nn.Parameter(torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"\['params'\]\[\d+\] is now \(3, 5\), but DMuon knows that place as "
                                         r"parameter 'c_fc.weight' of shape \(16, 64\)"):
        opt.step()
    group["params"].pop()
    with pytest.raises(ValueError, match=r"param group \d holds \d+ parameters, but DMuon was given \d+"):
        opt.step()


def test_param_names_place_the_entries_when_the_order_changes():
    model = TinyGPT2(dim=16)
    opt = dmuon.DMuon(model)
    group = next(g for g in opt.param_groups if g["use_muon"])
    names = [opt.param_name(p) for p in group["params"]]
    replace_parameters(model, opt)
    group["params"] = group["params"][::-1]
    group["param_names"] = names[::-1]
    assert opt.param_name(model.c_fc.weight) == "c_fc.weight"
    assert opt.matrix_view(model.c_fc.weight).transposed
    assert not opt.matrix_view(model.c_attn.weight).row_blocks


def test_fully_shard_after_construction_matches_fully_shard_before():
    out = run_distributed(fully_shard_after_construction, 2)
    for rank in (0, 1):
        assert out[rank]["differ"] == [], out[rank]
        assert all(name == given for name, given in out[rank]["names"].items()), out[rank]["names"]
        assert out[rank]["transposed"]


# ---------------------------------------------------------------- on the ranks
# FSDP2's fully_shard applied after DMuon was made (the caller re-points param_groups at the
# sharded parameters, as Accelerate does) against fully_shard before it.

def _trained(model: nn.Module, opt: dmuon.DMuon, world: int, rank: int, steps: int) -> None:
    for step in range(steps):
        ids = torch.randint(0, 64, (2 * world, 8), generator=torch.Generator().manual_seed(100 + step))[2 * rank:][:2]
        opt.zero_grad()
        model(ids).square().mean().backward()
        opt.step()


def fully_shard_after_construction(rank: int, world: int, steps: int = 3) -> dict:
    """Every parameter after `steps` steps, both ways (whole tensors), and the names and
    views DMuon gives the sharded parameters."""
    torch.manual_seed(0)
    initial = TinyGPT2(dim=16)
    options = dict(lr=1e-2, weight_decay=0.1, math=dmuon.MuonMath(adjust_lr="original"),
                   execution=dmuon.Execution(planner="lpt"))
    mesh = init_device_mesh("cpu", (world,))

    before = copy.deepcopy(initial)
    fully_shard(before, mesh=mesh)
    opt_before = dmuon.DMuon(before, **options)
    _trained(before, opt_before, world, rank, steps)

    after = copy.deepcopy(initial)
    opt_after = dmuon.DMuon(after, **options)
    name_of = {id(p): n for n, p in after.named_parameters()}
    fully_shard(after, mesh=mesh)
    sharded = dict(after.named_parameters())
    for group in opt_after.param_groups:
        group["params"] = [sharded[name_of[id(p)]] for p in group["params"]]
    _trained(after, opt_after, world, rank, steps)

    out = {"names": {n: opt_after.param_name(p) for n, p in after.named_parameters()},
           "transposed": opt_after.matrix_view(after.c_fc.weight).transposed,
           "differ": []}
    for (name, a), b in zip(after.named_parameters(), before.parameters()):
        if not torch.equal(a.full_tensor(), b.full_tensor()):
            out["differ"].append(name)
    return out
