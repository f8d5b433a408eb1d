"""Module auto-routing: which parameters Muon gets, and how they are viewed as matrices."""

from __future__ import annotations

import torch
from torch import nn

import dmuon


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.attn_q = nn.Linear(dim, dim)
        self.conv = nn.Conv2d(1, 4, kernel_size=3)
        self.experts = nn.Parameter(torch.randn(4, dim, 2 * dim))
        self.norm = nn.LayerNorm(dim)
        self.scale = nn.Parameter(torch.ones(()))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)


def routes(model, **kwargs):
    return {r.name: r for r in dmuon.route_module(model, **kwargs)}


def test_module_routing_rules():
    r = routes(TinyLM())
    assert r["attn_q.weight"].use_muon and r["attn_q.weight"].batch_dims == 0
    assert r["conv.weight"].use_muon and r["conv.weight"].batch_dims == 0
    assert r["experts"].use_muon and r["experts"].batch_dims == 1
    for name in ("tok.weight", "attn_q.bias", "conv.bias", "norm.weight", "norm.bias", "scale", "lm_head.weight"):
        assert not r[name].use_muon, (name, r[name].reason)
    # Frozen parameters are routed too (torch optimizers keep them; they train once unfrozen).
    assert r["frozen.weight"].use_muon and not r["frozen.weight"].param.requires_grad


def test_head_detected_by_vocab_size_and_by_tying():
    class Untitled(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 8)
            self.proj = nn.Linear(8, 8)
            self.out = nn.Linear(8, 100)  # out_features == vocabulary: the head

    r = routes(Untitled())
    assert r["proj.weight"].use_muon and not r["out.weight"].use_muon

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 8)
            self.decoder = nn.Linear(8, 100, bias=False)
            self.decoder.weight = self.emb.weight

    r = routes(Tied())
    assert list(r) == ["emb.weight"] and not r["emb.weight"].use_muon


def test_muon_filter_overrides_and_rejects_vectors():
    r = routes(TinyLM(), muon_filter=lambda name, p: name == "lm_head.weight")
    assert r["lm_head.weight"].use_muon and not r["attn_q.weight"].use_muon
    try:
        routes(TinyLM(), muon_filter=lambda name, p: name == "norm.weight")
    except ValueError as error:
        assert "norm.weight" in str(error)
    else:
        raise AssertionError("a 1-D parameter selected for Muon must be rejected")


def test_iterable_and_group_inputs():
    a, b, c = nn.Parameter(torch.randn(4, 6)), nn.Parameter(torch.randn(6)), nn.Parameter(torch.randn(2, 3, 5))
    opt = dmuon.DMuon([a, b, c])
    kinds = {g["use_muon"]: g["params"] for g in opt.param_groups}
    assert kinds[True] == [a, c] and kinds[False] == [b]
    opt = dmuon.DMuon([{"params": [a], "use_muon": True, "lr": 0.5}, {"params": [b], "use_muon": False}], lr=0.1)
    assert opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[1]["lr"] == 0.1
    opt = dmuon.DMuon([("weight", a), ("bias", b)])
    assert opt.param_name(a) == "weight" and opt.param_name(b) == "bias"


def test_adamw_defaults_follow_muon_unless_given():
    model = TinyLM()
    opt = dmuon.DMuon(model, lr=0.3, weight_decay=0.2)
    adamw = next(g for g in opt.param_groups if not g["use_muon"])
    assert adamw["lr"] == 0.3 and adamw["weight_decay"] == 0.2 and adamw["eps"] == 1e-8
    opt = dmuon.DMuon(model, lr=0.3, adamw_lr=0.01, adamw_weight_decay=0.0, adamw_betas=(0.8, 0.9))
    adamw = next(g for g in opt.param_groups if not g["use_muon"])
    assert adamw["lr"] == 0.01 and adamw["weight_decay"] == 0.0 and adamw["betas"] == (0.8, 0.9)
