"""Models for `python -m dmuon bench e2e`: a Hugging Face decoder built from its public
config.json values with random weights (through `transformers`, imported only here and
only for those models), or dmuon's own small GPT (`tiny`, no extra package, runs on CPUs).

A spec says how to build the model, which submodules FSDP2 shards one by one (the decoder
layers), and the training loss on a batch of token ids.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn

# Public config.json values of the models whose Muon matrices ship as manifests
# (python/dmuon/cli/plan/manifests; tests check that both agree). NOTE: the rotary constants
# (rope_theta, Llama 3.1's rope_scaling) are left at the library defaults: they change the
# rotation angles, not the work of a training step, and their keyword names moved between
# transformers releases.
HF_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu")),
    "qwen2.5-1.5b": ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072,
                                   rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu")),
    "qwen2.5-7b": ("qwen2", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
                                 rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu")),
    "llama-3.1-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu")),
}

# dmuon's own GPT for CPU runs and tests (byte vocabulary). NOTE: d_model 48, not 64: an
# MLP width of 4·64 = 256 would equal the byte vocabulary, and routing takes such a Linear
# for an output head (AdamW).
TINY = dict(d_model=48, num_layers=2, num_heads=4, mlp_ratio=4)
# Its blocks by name: `tiny8` is the same GPT with 8 blocks (48 Muon matrices).
TINY_BLOCKS = {"tiny": 2, "tiny8": 8}

MODEL_NAMES = (*TINY_BLOCKS, *HF_CONFIGS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """How `bench e2e` builds, shards and trains one model."""

    name: str
    description: str
    vocab_size: int
    build: Callable[[], nn.Module]  # a fresh model in float32 on the current default device
    blocks: Callable[[nn.Module], list[nn.Module]]  # the units FSDP2 shards before the root
    loss: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # mean next-token loss of [B, T] ids


def require_transformers(name: str) -> Any:
    """The `transformers` module, or an error saying which model needs it."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError(f"--model {name} builds a Hugging Face model from its config and needs the "
                          "'transformers' package (pip install transformers); --model tiny runs without it") from error
    return transformers


def model_spec(name: str, seq: int) -> ModelSpec:
    """The spec of --model `name` for sequences of `seq` tokens."""
    if name in TINY_BLOCKS:
        return _tiny_spec(name, seq)
    if name in HF_CONFIGS:
        return _hf_spec(name)
    raise ValueError(f"--model must be one of {', '.join(MODEL_NAMES)}, got {name!r}")


def _tiny_spec(name: str, seq: int) -> ModelSpec:
    from dmuon.cli.train.data import VOCAB_SIZE
    from dmuon.cli.train.model import GPT

    def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens)  # [B, T, vocab]
        return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())

    shape = {**TINY, "num_layers": TINY_BLOCKS[name]}
    return ModelSpec(name=name, description=f"dmuon.cli.train.model.GPT {shape}", vocab_size=VOCAB_SIZE,
                     build=lambda: GPT(vocab_size=VOCAB_SIZE, max_seq_len=seq, **shape),
                     blocks=lambda model: list(model.blocks), loss=loss)


def hf_config(name: str) -> Any:
    """The transformers config of a shipped model (training: no KV cache, SDPA attention)."""
    transformers = require_transformers(name)
    model_type, values = HF_CONFIGS[name]
    config = transformers.AutoConfig.for_model(model_type, **values)
    config.use_cache = False
    return config


def _hf_spec(name: str) -> ModelSpec:
    transformers = require_transformers(name)
    config = hf_config(name)

    def build() -> nn.Module:
        # NOTE: SDPA (fused causal attention, no [T, T] matrix) is transformers' default;
        # asked for explicitly where from_config takes the keyword.
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_config(config)
        return model.float()

    def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, labels=tokens).loss

    model_type = HF_CONFIGS[name][0]
    return ModelSpec(name=name, description=f"transformers {model_type} from config, random weights",
                     vocab_size=HF_CONFIGS[name][1]["vocab_size"], build=build,
                     blocks=lambda model: list(model.model.layers), loss=loss)


def check_muon_shapes(model: nn.Module, name: str) -> None:
    """The built model's Muon matrices (dmuon's routing) must be those its config describes
    (plan.manifest_from_config; the shipped manifests are checked against HF_CONFIGS by the
    tests), so the end-to-end figures and `bench step`'s are about the same matrices."""
    if name not in HF_CONFIGS:
        return
    from dmuon.cli.plan.manifest import manifest_from_config
    from dmuon import route_module

    built = Counter(tuple(r.param.shape) for r in route_module(model) if r.use_muon)
    expected = Counter((m.rows, m.cols) if m.batch == 1 else (m.batch, m.rows, m.cols)
                       for m in manifest_from_config(HF_CONFIGS[name][1], name=name).matrices)
    if built != expected:
        raise ValueError(f"--model {name}: the built model's Muon matrices {dict(built)} differ from those of "
                         f"its config {dict(expected)}")
