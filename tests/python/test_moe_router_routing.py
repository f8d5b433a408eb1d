"""An MoE router's gate (HF Qwen2-MoE's and Mixtral's ``mlp.gate.weight``, a router module's own
[E, H] weight; torchtitan's ``moe.router.gate``, a Linear) is a matrix on Muon, and every input
form that carries names gives every parameter of those models the same side, matrix view and
reason: the model, ``named_parameters()``, param groups with ``param_names`` (torchtitan's
container) and groups of (name, tensor) pairs; bare tensors give the same sides to all but what
needs a name (embeddings, head, a fused gate_up's split, a one-row gate), the router included.
Real packages, tiny configs (skipped without them)."""

from __future__ import annotations

import warnings

import pytest
import torch

import dmuon

transformers = pytest.importorskip("transformers")

E, H = 4, 32
ROUTER_REASON = "MoE router (module named 'router' or 'gate'): a matrix"


def qwen2_moe():
    return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        hidden_size=H, intermediate_size=64, moe_intermediate_size=24, shared_expert_intermediate_size=48,
        num_experts=E, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64))


def mixtral():
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        hidden_size=H, intermediate_size=48, num_local_experts=E, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64))


def torchtitan_moe():
    """torchtitan's MoE layer (TokenChoiceTopKRouter with a Linear gate, GroupedExperts stacks,
    shared experts) as its models hold it, under ``moe``."""
    config_utils = pytest.importorskip("torchtitan.models.common.config_utils")
    config = config_utils.make_moe_config(
        num_experts=E,
        router=config_utils.make_router_config(dim=H, num_experts=E, gate_param_init={}, top_k=2),
        routed_experts=config_utils.make_routed_experts_config(dim=H, hidden_dim=24, num_experts=E, top_k=2,
                                                              param_init={}, comm_backend="standard"),
        shared_experts=config_utils.make_ffn_config(dim=H, hidden_dim=48, w1_param_init={}, w2w3_param_init={}))
    model = torch.nn.Module()
    model.moe = config.build()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)  # NOTE: built empty; torchtitan's init_weights runs in its trainer
    return model


MODELS = {"qwen2_moe": (qwen2_moe, "model.layers.1.mlp.gate.weight"),
          "mixtral": (mixtral, "model.layers.1.mlp.gate.weight"),
          "torchtitan": (torchtitan_moe, "moe.router.gate.weight")}


def decisions(optimizer):
    """{name: (side, matrix view or None, reason)} of every parameter of `optimizer`."""
    reasons = {e.name: e.reason for e in optimizer.routing_summary().entries}
    return {optimizer.param_name(p): (g["use_muon"], optimizer.matrix_view(p) if g["use_muon"] else None,
                                      reasons[optimizer.param_name(p)])
            for g in optimizer.param_groups for p in g["params"]}


def named_forms(model):
    named = list(model.named_parameters())
    return {"named_parameters": model.named_parameters(),
            "param_names": [{"params": [p for _, p in named], "param_names": [n for n, _ in named], "lr": 0.02}],
            "pairs": [{"params": [(n, p) for n, p in named if p.dim() >= 2], "weight_decay": 0.1},
                      {"params": [(n, p) for n, p in named if p.dim() < 2], "weight_decay": 0.0}]}


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_the_router_is_a_matrix_on_muon_and_every_named_form_routes_as_the_model(arch):
    build, router = MODELS[arch]
    model = build()
    by_module = decisions(dmuon.DMuon(model))
    assert by_module[router] == (True, dmuon.MatrixView(), ROUTER_REASON)
    for form, params in named_forms(model).items():
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # names given: no warning about unknown roles
            assert decisions(dmuon.DMuon(params)) == by_module, form


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_bare_tensors_put_every_matrix_but_the_embeddings_on_the_same_side(arch):
    build, router = MODELS[arch]
    model = build()
    by_module = decisions(dmuon.DMuon(model))
    with pytest.warns(UserWarning, match="without names"):
        bare = dmuon.DMuon(model.parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    sides = {names[id(p)]: (g["use_muon"], bare.matrix_view(p) if g["use_muon"] else None)
             for g in bare.param_groups for p in g["params"]}
    differ = {n for n, side in sides.items() if side != by_module[n][:2]}
    # NOTE: what needs a name: the embedding and the head (AdamW), a fused gate_up_proj's split
    # (with its down_proj), a [1, H] gate's role (bare, a matrix of one row stays on Muon).
    assert differ == {n for n in by_module if "embed" in n or "lm_head" in n or n.endswith("gate_up_proj")
                      or n.endswith("shared_expert_gate.weight")}, differ
    assert sides[router] == (True, dmuon.MatrixView())


def test_qwen2_moes_experts_split_like_dense_gate_and_up_and_its_one_row_gate_stays_on_adamw():
    model = qwen2_moe()
    optimizer = dmuon.DMuon(model)
    side = decisions(optimizer)
    assert side["model.layers.0.mlp.shared_expert_gate.weight"][:2] == (False, None)  # [1, H]
    assert "one row or column" in side["model.layers.0.mlp.shared_expert_gate.weight"][2]
    assert side["model.layers.0.mlp.gate.weight"][0]  # [E, H]
    assert side["model.layers.0.mlp.experts.gate_up_proj"][:2] == (True, dmuon.MatrixView(batch_dims=1,
                                                                                        row_blocks=(24, 24)))
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


def test_router_names_route_alike_without_a_model():
    """Mixtral's older FQN (block_sparse_moe.gate), a module named router, and a [1, H] gate."""
    pairs = [("model.layers.0.block_sparse_moe.gate.weight", torch.randn(E, H)),
             ("layers.0.moe.router.weight", torch.randn(E, H)),
             ("layers.0.mlp.shared_expert_gate.weight", torch.randn(1, H)),
             ("layers.0.mlp.up_proj.weight", torch.randn(2 * H, H))]
    routed = dmuon.routing.route_named(pairs)
    assert [(r.use_muon, r.reason) for r in routed] == [
        (True, ROUTER_REASON), (True, ROUTER_REASON), (False, dmuon.routing._VECTOR_REASON), (True, "matrix")]


@pytest.mark.parametrize("arch", ["qwen2_moe", "torchtitan"])
def test_the_router_trains_alike_by_module_and_by_param_names(arch):
    """Two steps of the same model from two input forms end bit-exactly alike (same routing,
    same matrices, same batches)."""
    build, router = MODELS[arch]
    torch.manual_seed(0)
    models = [build(), None]
    models[1] = build()
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [dmuon.DMuon(models[0], lr=0.02), dmuon.DMuon(named_forms(models[1])["param_names"], lr=0.02)]
    before = dict(models[0].named_parameters())[router].detach().clone()
    for step in range(2):
        for model, optimizer in zip(models, optimizers):
            loss = sum(p.float().square().sum() * (i + 1) for i, p in enumerate(model.parameters()))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert not torch.equal(dict(models[0].named_parameters())[router], before)
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(p, q), name
