"""Routing of real Hugging Face architectures (tiny local configs, random init, no downloads;
skipped without transformers): GPT-2's Conv1D, Qwen2 by module and by names, ViT's tokens (Qwen2-MoE:
test_moe_router_routing)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import dmuon
from worker_tensors import reference_of

transformers = pytest.importorskip("transformers")


def sides(optimizer):
    return {optimizer.param_name(p): g["use_muon"] for g in optimizer.param_groups for p in g["params"]}


def gpt2():
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=16,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def test_gpt2_conv1d_layers_go_to_muon_transposed_and_step_as_the_reference():
    model = gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # most of the matrices on Muon: no warning
        optimizer = dmuon.DMuon(model, lr=0.02, adjust_lr="original")
    side = sides(optimizer)
    assert side["transformer.h.0.attn.c_attn.weight"] and side["transformer.h.1.mlp.c_proj.weight"]
    assert not side["transformer.wte.weight"] and not side["transformer.wpe.weight"]
    assert "lm_head.weight" not in side  # tied to wte
    assert all(optimizer.matrix_view(p).transposed for p in optimizer.param_groups[0]["params"])

    exact = copy.deepcopy(model)
    reference = reference_of(optimizer, exact)
    ids = torch.randint(0, 100, (2, 16))
    for m in (model, exact):
        m(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    reference.step()
    for (name, p), q in zip(model.named_parameters(), exact.parameters()):
        torch.testing.assert_close(p, q.float(), rtol=1e-4, atol=1e-6, msg=name)


def test_qwen2_routes_alike_by_module_and_by_named_parameters():
    config = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    model = transformers.Qwen2ForCausalLM(config)
    by_module = sides(dmuon.DMuon(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        by_names = sides(dmuon.DMuon(model.named_parameters()))
    assert by_module == by_names
    assert not by_module["model.embed_tokens.weight"] and not by_module["lm_head.weight"]
    assert by_module["model.layers.0.self_attn.q_proj.weight"] and by_module["model.layers.1.mlp.down_proj.weight"]
    groups = [{"params": [(n, p) for n, p in model.named_parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [(n, p) for n, p in model.named_parameters() if p.dim() < 2], "weight_decay": 0.0}]
    assert sides(dmuon.DMuon(groups)) == by_module


def test_vit_classifier_tokens_and_patch_embedding_go_to_adamw():
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=16, patch_size=4, num_labels=5)
    side = sides(dmuon.DMuon(transformers.ViTForImageClassification(config)))
    for name, use_muon in side.items():
        if "cls_token" in name or "position_embeddings" in name or "patch_embeddings" in name or "classifier" in name:
            assert not use_muon, name
    assert sum(side.values()) == 6  # q, k, v, o, fc1, fc2
