"""Routing that is right by default and visible: names route when names exist, module rules
cover Conv1D, MultiheadAttention, positional tokens, expert stacks and classifier heads, and
DMuon says what it decided (routing_summary, a log line, a warning when Muon gets little)."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch import nn

import dmuon
from contract_models import (Conv1D, MoEModel, ResNetLike, TinyDecoder, TinyGPT2, TinyViT, mlp_classifier)
from worker_tensors import reference_of


def muon_names(optimizer) -> set[str]:
    return {optimizer.param_name(p) for g in optimizer.param_groups if g["use_muon"] for p in g["params"]}


def adamw_names(optimizer) -> set[str]:
    return {optimizer.param_name(p) for g in optimizer.param_groups if not g["use_muon"] for p in g["params"]}


def routes(model):
    return {r.name: r for r in dmuon.route_module(model)}


# ---------------------------------------------------------------------------- names and lists
def test_bare_parameters_warn_once_naming_the_matrices_and_the_fix():
    model = TinyDecoder()
    with pytest.warns(UserWarning) as record:
        dmuon.DMuon(model.parameters())
    texts = [str(w.message) for w in record if "without names" in str(w.message)]
    assert len(texts) == 1, [str(w.message) for w in record]
    assert "params[0] (32, 16)" in texts[0]  # the embedding, by its position and shape
    assert "DMuon(model" in texts[0] and "named_parameters()" in texts[0]


def test_named_parameters_route_like_the_module():
    model = TinyDecoder()
    by_module = dmuon.DMuon(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # names are given: no warning about unknown roles
        by_names = dmuon.DMuon(model.named_parameters())
    assert muon_names(by_names) == muon_names(by_module) == {"q_proj.weight", "o_proj.weight", "up_proj.weight",
                                                             "down_proj.weight"}
    assert {"embed_tokens.weight", "lm_head.weight"} <= adamw_names(by_names)


def test_named_decay_groups_keep_their_options_on_both_sides():
    model = TinyDecoder()
    named = list(model.named_parameters())
    groups = [{"params": [(n, p) for n, p in named if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [(n, p) for n, p in named if p.dim() < 2], "weight_decay": 0.0}]
    opt = dmuon.DMuon(groups, lr=0.01)
    kinds = [(g["use_muon"], g["weight_decay"], sorted(opt.param_name(p) for p in g["params"]))
             for g in opt.param_groups]
    assert kinds == [
        (True, 0.1, ["down_proj.weight", "o_proj.weight", "q_proj.weight", "up_proj.weight"]),
        (False, 0.1, ["embed_tokens.weight", "lm_head.weight"]),
        (False, 0.0, ["norm.bias", "norm.weight"]),
    ]


def test_unnamed_decay_groups_are_split_by_shape_with_the_warning():
    model = TinyDecoder()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    with pytest.warns(UserWarning, match="without names"):
        opt = dmuon.DMuon([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}])
    assert [g["use_muon"] for g in opt.param_groups] == [True, False]


# ---------------------------------------------------------------------------- module rules
def test_conv1d_weight_is_a_transposed_matrix_for_muon():
    r = routes(TinyGPT2())
    for name in ("c_attn.weight", "c_fc.weight", "c_proj.weight"):
        assert r[name].use_muon and r[name].transposed, (name, r[name].reason)
    for name in ("wte.weight", "wpe.weight", "c_attn.bias", "ln_f.weight"):
        assert not r[name].use_muon, (name, r[name].reason)
    assert "lm_head.weight" not in r  # tied to wte: one parameter


@pytest.mark.parametrize("adjust_lr", ["original", "spectral", "match_rms_adamw"])
def test_conv1d_steps_exactly_as_the_linear_it_transposes(adjust_lr):
    """A Conv1D (in, out) weight W and a Linear (out, in) weight Wᵀ with the transposed
    gradient must get transposed updates: the same matrix orthogonalized, lr by (out, in)."""
    torch.manual_seed(1)
    conv = Conv1D(nf=24, nx=8)
    linear = nn.Linear(8, 24, bias=False)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.T)
    wrap_conv = nn.ModuleDict({"proj": conv, "head": nn.Linear(24, 2)})
    wrap_linear = nn.ModuleDict({"proj": linear, "head": nn.Linear(24, 2)})
    opts = [dmuon.DMuon(m, lr=0.05, weight_decay=0.1, adjust_lr=adjust_lr) for m in (wrap_conv, wrap_linear)]
    assert all(muon_names(opt) == {"proj.weight"} for opt in opts)
    for _ in range(3):
        grad = torch.randn(8, 24)
        conv.weight.grad, linear.weight.grad = grad.clone(), grad.T.clone()
        conv.bias.grad = None
        for opt in opts:
            opt.step()
        torch.testing.assert_close(conv.weight.T, linear.weight, rtol=1e-5, atol=1e-6)


def test_multihead_attention_in_proj_orthogonalizes_q_k_v_separately():
    attn = nn.MultiheadAttention(8, num_heads=2)
    r = routes(nn.ModuleDict({"attn": attn, "head": nn.Linear(8, 3)}))
    assert r["attn.in_proj_weight"].use_muon and r["attn.in_proj_weight"].row_blocks == (8, 8, 8)
    assert r["attn.out_proj.weight"].use_muon and not r["attn.in_proj_bias"].use_muon

    exact = copy.deepcopy(attn)
    whole = copy.deepcopy(attn)
    opt = dmuon.DMuon(attn, lr=0.05, weight_decay=0.0, ns_algorithm="standard")
    reference, whole_ref = reference_of(opt, exact), reference_of(opt, whole)
    whole_ref.groups[0]["row_blocks"] = None
    grads = {name: torch.randn_like(p) for name, p in attn.named_parameters()}
    for model in (attn, exact, whole):
        for name, p in model.named_parameters():
            p.grad = grads[name].clone()
    opt.step()
    reference.step()
    whole_ref.step()
    torch.testing.assert_close(attn.in_proj_weight, exact.in_proj_weight.float(), rtol=1e-4, atol=1e-5)
    # NOTE: so the test can fail: orthogonalizing the fused (24, 8) matrix as one differs.
    assert (whole.in_proj_weight - exact.in_proj_weight).abs().max() > 1e-3


def test_positional_embeddings_tokens_and_patch_embedding_go_to_adamw():
    r = routes(TinyViT())
    for name in ("cls_token", "pos_embed", "patch_embed.weight", "head.weight"):
        assert not r[name].use_muon, (name, r[name].reason)
    for name in ("attn.in_proj_weight", "attn.out_proj.weight", "mlp.0.weight", "mlp.2.weight"):
        assert r[name].use_muon, (name, r[name].reason)


def test_expert_stacks_are_recognised_by_module_or_name_other_3d_tables_are_not():
    r = routes(MoEModel())
    assert r["moe.gate_up"].use_muon and r["moe.gate_up"].batch_dims == 1
    assert r["moe.down"].use_muon and r["moe.down"].batch_dims == 1
    assert not r["bias.tables"].use_muon, r["bias.tables"].reason
    # By names alone a 3-D tensor is a stack unless its name says positional embedding or token.
    named = dmuon.DMuon([("layers.0.experts.w1", nn.Parameter(torch.randn(4, 6, 8))),
                         ("pos_embed", nn.Parameter(torch.randn(1, 6, 8))),
                         ("cls_token", nn.Parameter(torch.randn(1, 1, 8))),
                         ("layers.0.q.weight", nn.Parameter(torch.randn(8, 8)))])
    assert muon_names(named) == {"layers.0.experts.w1", "layers.0.q.weight"}
    assert named.matrix_view(named.param_groups[0]["params"][0]).batch_dims == 1


@pytest.mark.parametrize("build, head", [(ResNetLike, "fc.weight"), (mlp_classifier, "4.weight")],
                         ids=["top-level-fc", "last-linear-of-sequential"])
def test_classifier_heads_go_to_adamw(build, head):
    model = build()
    r = routes(model)
    assert not r[head].use_muon, r[head].reason
    hidden = [n for n, x in r.items() if x.param.dim() >= 2 and n != head]
    assert hidden and all(r[n].use_muon for n in hidden), {n: r[n].reason for n in hidden}
    # The same from names alone.
    assert head not in muon_names(dmuon.DMuon(model.named_parameters()))


def test_the_last_projection_of_a_residual_stack_is_not_a_head():
    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.ModuleDict({"up": nn.Linear(8, 16), "down": nn.Linear(16, 8)})
                                        for _ in range(2))

    r = routes(Blocks())
    assert all(r[f"layers.{i}.{k}.weight"].use_muon for i in range(2) for k in ("up", "down"))


# ---------------------------------------------------------------------------- visible
def test_routing_summary_and_the_construction_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="dmuon"):
        opt = dmuon.DMuon(TinyDecoder())
    summary = opt.routing_summary()
    assert len(summary.muon) == 4 and summary.muon_elements == 16 * 16 * 2 + 2 * 16 * 48
    assert {e.name for e in summary.adamw_matrices} == {"embed_tokens.weight", "lm_head.weight"}
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "dmuon"]
    assert len(lines) == 1 and "Muon 4 parameters" in lines[0] and "embed_tokens.weight" in lines[0]
    rows = {row.split()[0]: row for row in str(summary).splitlines()[2:]}
    assert rows["lm_head.weight"].endswith("AdamW  output head (module named 'lm_head')")
    assert rows["q_proj.weight"].endswith("Muon   matrix")


def test_warns_when_muon_gets_nothing_or_under_half_of_the_matrices():
    class EmbeddingOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.lm_head = nn.Linear(8, 50)

    with pytest.warns(UserWarning, match="no parameter to Muon"):
        dmuon.DMuon(EmbeddingOnly())
    with pytest.warns(UserWarning, match=r"only \d+% of the matrix elements"):
        dmuon.DMuon(TinyDecoder(vocab=4000, dim=8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dmuon.DMuon(TinyDecoder(vocab=20, dim=16))
