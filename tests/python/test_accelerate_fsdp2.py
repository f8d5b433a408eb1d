"""accelerate's real FSDP2 ``prepare`` (``accelerator.prepare(model, DMuon(model))``, which puts
a fresh parameter object into the module and into param_groups) changes nothing in DMuon's
update: GPT-2 (HF Conv1D, transposed) with an nn.MultiheadAttention (q, k, v orthogonalized
apart) trains to the weights of the same run sharded by plain ``fully_shard``, on one process
(world 1: Gloo on the CPU, NCCL on one GPU). Reference: that plain run; CPU bit for bit, GPU
within 1e-6 of the weights (the swap reproducer moved GPT-2 by 2.6e-2 in 6 steps). The HF
Trainer's FSDP2 path through dmuon.integrations.hf.create_optimizer too (GPU only: the Trainer
enables FSDP only on accelerators)."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from accelerate import Accelerator, FullyShardedDataParallelPlugin  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402

import dmuon  # noqa: E402
from dist_harness import run_distributed  # noqa: E402


# ---------------------------------------------------------------- the rank
# The same model and batches trained by DMuon twice, once sharded by plain fully_shard and
# once prepared by accelerate's FSDP2 prepare; and the HF Trainer's run with
# dmuon.integrations.hf, unsharded and under its FSDP2.

VOCAB, DIM, SEQ, STEPS = 100, 64, 16, 3
CONV1D = "gpt2.transformer.h.0.mlp.c_fc.weight"
IN_PROJ = "mha.in_proj_weight"
# NOTE: the options of the swap reproducer (presets.torch_muon's lr adjustment): with
# adjust_lr="original" a Conv1D that lost its transposition steps with another lr ratio.
OPTIONS = dict(lr=1e-2, math=dmuon.MuonMath(momentum=0.0, nesterov=False, adjust_lr="original"))


class GPT2WithMHA(nn.Module):
    """GPT-2 (HF Conv1D layers, lm_head tied to wte) with an nn.MultiheadAttention over its output."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.GPT2Config(n_embd=DIM, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                                         bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        self.gpt2 = transformers.GPT2LMHeadModel(config)
        self.mha = nn.MultiheadAttention(DIM, 4, batch_first=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.gpt2.transformer(input_ids=ids).last_hidden_state
        h = h + self.mha(h, h, h, need_weights=False)[0]
        logits = self.gpt2.lm_head(h)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def batch(step: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(step)).to(device)


def full_weights(model: nn.Module) -> dict[str, Any]:
    """Whole weights as numpy arrays (a fresh rank exits before torch's shared-memory tensors
    would reach the parent)."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().numpy().copy()
            for n, p in model.named_parameters()}


def train(model: nn.Module, optimizer: Any, device: torch.device, backward) -> None:
    for step in range(STEPS):
        backward(model(batch(step, device)))
        optimizer.step()
        optimizer.zero_grad()


def plain_fsdp2(model: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    model.to(device)
    for block in model.gpt2.transformer.h:
        fully_shard(block)
    fully_shard(model)
    optimizer = dmuon.DMuon(model, **OPTIONS)
    train(model, optimizer, device, lambda loss: loss.backward())
    return full_weights(model)


def accelerate_fsdp2(model: nn.Module, on_cpu: bool) -> dict[str, Any]:
    """accelerator.prepare(model, DMuon(model)): DMuon made before the prepare that replaces
    every parameter object."""
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["GPT2Block"])
    accelerator = Accelerator(cpu=on_cpu, fsdp_plugin=plugin)
    if on_cpu:
        # NOTE: accelerate takes an fsdp_plugin only on accelerators (MULTI_CPU stays DDP);
        # its FSDP2 prepare itself runs on CPU processes over Gloo once the state says FSDP.
        accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = plugin
    assert accelerator.is_fsdp2
    optimizer = dmuon.DMuon(model, **OPTIONS)
    seen = {id(p) for p in model.parameters()}
    prepared, wrapped = accelerator.prepare(model, optimizer)
    replaced = not seen & {id(p) for g in optimizer.param_groups for p in g["params"]}
    train(prepared, wrapped, accelerator.device, accelerator.backward)
    params = dict(prepared.named_parameters())
    return {"weights": full_weights(prepared), "replaced": replaced,
            "names": {optimizer.param_name(params[n]) for n in (CONV1D, IN_PROJ)},
            "conv1d_view": optimizer.matrix_view(params[CONV1D]),
            "in_proj_view": optimizer.matrix_view(params[IN_PROJ])}


def plain_and_accelerate(rank: int, world: int, device_type: str) -> dict[str, Any]:
    """Both runs from one initial model; the plain run first (accelerate's state is the process's)."""
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    model = GPT2WithMHA()
    initial = full_weights(model)
    plain = plain_fsdp2(copy.deepcopy(model), device)
    prepared = accelerate_fsdp2(model, on_cpu=device_type == "cpu")
    return {"initial": initial, "plain": plain, **prepared}


class TokenBlocks(torch.utils.data.Dataset):
    """Random token blocks; labels are the inputs (the Trainer's causal-LM loss)."""

    def __init__(self, rows: int = 12) -> None:
        self.ids = torch.randint(0, VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[idx], "labels": self.ids[idx]}


def trainer_run(device_type: str, fsdp2: bool, output_dir: str) -> dict[str, Any]:
    """HF Trainer with dmuon.integrations.hf.create_optimizer(trainer): under FSDP2 the Trainer
    makes DMuon from the model and then prepares both (accelerate replaces the parameters)."""
    from accelerate.state import AcceleratorState

    from dmuon.integrations import unwrap
    from dmuon.integrations.hf import create_optimizer

    AcceleratorState._reset_state()  # NOTE: each Trainer makes its own Accelerator; the state is the process's
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.manual_seed(0)
    model = GPT2WithMHA().gpt2
    seen = {id(p) for p in model.parameters()}
    fsdp = dict(fsdp="full_shard", fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]})
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-2,
        lr_scheduler_type="constant", report_to=[], seed=0, data_seed=0, use_cpu=device_type == "cpu",
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, **(fsdp if fsdp2 else {}))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=TokenBlocks())
    create_optimizer(trainer, math=OPTIONS["math"])
    trainer.train()
    optimizer = unwrap(trainer.optimizer)
    conv1d = dict(trainer.model.named_parameters())[CONV1D.removeprefix("gpt2.")]
    return {"weights": full_weights(trainer.model),
            "replaced": not seen & {id(p) for g in optimizer.param_groups for p in g["params"]},
            "conv1d_name": optimizer.param_name(conv1d), "conv1d_view": optimizer.matrix_view(conv1d)}


def trainer_with_and_without_fsdp2(rank: int, world: int, device_type: str, output_dir: str,
                                   fsdp2: bool = True) -> dict[str, Any]:
    """The same Trainer run unsharded (parameters kept) and under FSDP2 (`fsdp2`; False: twice
    unsharded, which a machine without an accelerator can run)."""
    return {"plain": trainer_run(device_type, False, f"{output_dir}/plain"),
            "fsdp2": trainer_run(device_type, fsdp2, f"{output_dir}/fsdp2")}


# ---------------------------------------------------------------- tests
# NOTE: the CPU case forces accelerate's FSDP2 state onto CPU processes (accelerate_fsdp2
# above); where a GPU is present, that forced path shards the blocks and the root over two
# process groups (DMuon refuses Muon parameters on two groups, naming them), so there the
# CUDA case runs instead.
_CPU_CASE = pytest.param("cpu", marks=pytest.mark.skipif(
    torch.cuda.is_available(), reason="a GPU is present: the cuda case covers accelerate's FSDP2 prepare here"))


@pytest.mark.parametrize("device", [_CPU_CASE, pytest.param("cuda", marks=pytest.mark.gpu)])
def test_accelerate_fsdp2_prepare_trains_as_plain_fully_shard(device):
    result = run_distributed(plain_and_accelerate, 1, device,
                             backend="nccl" if device == "cuda" else "gloo", fresh=True)[0]
    assert result["replaced"]  # prepare gave DMuon's param_groups other objects than it was made with
    assert result["names"] == {CONV1D, IN_PROJ}
    assert result["conv1d_view"] == dmuon.MatrixView(transposed=True)
    assert result["in_proj_view"] == dmuon.MatrixView(row_blocks=(DIM,) * 3)
    tolerance = dict(rtol=0.0, atol=0.0) if device == "cpu" else dict(rtol=0.0, atol=1e-6)
    for name, plain in result["plain"].items():
        plain, initial = torch.from_numpy(plain), torch.from_numpy(result["initial"][name])
        assert not torch.equal(plain, initial), name  # it trained
        torch.testing.assert_close(torch.from_numpy(result["weights"][name]), plain, **tolerance, msg=name)


@pytest.mark.gpu
def test_trainer_create_optimizer_under_fsdp2_trains_as_unsharded(tmp_path):
    """dmuon.integrations.hf.create_optimizer(trainer) with the Trainer's FSDP2 (DMuon made
    from the model, then prepared with it) against the same Trainer run unsharded (DDP, the
    parameters kept). NOTE: a Conv1D that lost its transposition here moves its weights by
    about 1e-3 a step (lr 1e-2, ratio 2 against 1); the two runs' transports differ, hence 1e-5."""
    result = run_distributed(trainer_with_and_without_fsdp2, 1, "cuda", str(tmp_path),
                             backend="nccl", fresh=True)[0]
    plain, sharded = result["plain"], result["fsdp2"]
    assert sharded["replaced"] and not plain["replaced"]
    assert sharded["conv1d_name"] == plain["conv1d_name"] == CONV1D.removeprefix("gpt2.")
    assert sharded["conv1d_view"] == plain["conv1d_view"] == dmuon.MatrixView(transposed=True)
    for name, weight in plain["weights"].items():
        torch.testing.assert_close(torch.from_numpy(sharded["weights"][name]), torch.from_numpy(weight),
                                   rtol=0.0, atol=1e-5, msg=name)
