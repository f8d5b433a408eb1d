"""dmuon.integrations.torchtitan against the real torchtitan (tests/requirements.txt): the
container from its config, torchtitan's lr-scheduler container and clipping, FQN-keyed DCP
checkpoints on 2 Gloo ranks under FSDP2, the state made before a first step; torchtitan's
Trainer on its debug model where the torch can import it (tests/requirements-trainer.txt)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed import fsdp

pytest.importorskip("torchtitan.components.optimizer")

import dmuon  # noqa: E402
import framework_models  # noqa: E402
import torchtitan_workers  # noqa: E402
from dist_harness import run_distributed  # noqa: E402
from dmuon.integrations.torchtitan import DMuonOptimizersContainer, dmuon_optimizers  # noqa: E402
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig  # noqa: E402


def test_the_config_is_torchtitans_and_builds_dmuon_with_torchtitans_groups():
    config = dmuon_optimizers(lr=0.02, adamw_lr=3e-3)
    assert isinstance(config, OptimizersContainer.Config)  # what torchtitan's Trainer.Config.optimizer holds
    assert config.to_dict()["optimizer_factory_kwargs_by_name"] == {"DMuon": {"adamw_lr": 3e-3}}
    model = framework_models.TinyLM()
    container = config.build(model_parts=[model])
    assert isinstance(container, DMuonOptimizersContainer)
    (optimizer,) = container.optimizers
    muon, adamw = optimizer.param_groups
    assert muon["param_names"] == [f"layers.{i}.{w}.weight" for i in range(2) for w in ("wq", "wo", "w1", "w3", "w2")]
    assert "tok_embeddings.weight" in adamw["param_names"] and "output.weight" in adamw["param_names"]
    assert (muon["lr"], adamw["lr"]) == (0.02, 3e-3)  # adamw_lr over the lr torchtitan puts in every group
    assert muon["fused"] is True and muon["foreach"] is False  # torchtitan's implementation switches, kept


def test_dmuon_and_adamw_groups_mix_in_one_container():
    config = DMuonOptimizersContainer.Config(param_groups=[
        ParamGroupConfig(pattern=r"tok_embeddings|output", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3}),
        ParamGroupConfig(pattern=r".*", optimizer_name="DMuon", optimizer_kwargs={"lr": 0.02})])
    model = framework_models.TinyLM()
    container = config.build(model_parts=[model])
    assert [type(o).__name__ for o in container.optimizers] == ["AdamW", "DMuon"]
    model.loss(framework_models.batch(0)).backward()
    container.step()
    flat = container.state_dict()
    assert "state.tok_embeddings.weight.exp_avg" in flat and "state.layers.0.wq.weight.momentum_buffer" in flat


def test_checkpoint_scheduler_and_clipping_on_two_ranks(tmp_path):
    results = run_distributed(torchtitan_workers.checkpoint_round_trip, 2, str(tmp_path / "step-3"))
    for out in results.values():
        assert out["lrs"] == [(True, 0.02), (False, 3e-3)]
        # The state made before a first step: parameters and every counter untouched.
        assert out["unchanged"] and out["counters"] == [("num_skipped_steps", 0.0), ("num_steps", 0.0), ("step", 0.0)]
        assert out["keys"] == ["state.layers.0.wq.weight.momentum_buffer"]
        assert out["equal"] and out["norms"] == out["resumed_norms"]
        assert out["last_lr"][0] < 0.02  # the cosine decay ran
    assert results[0]["norms"] == results[1]["norms"]


def test_state_made_on_one_rank_alone_blocks_no_rank_and_changes_nothing():
    for out in run_distributed(torchtitan_workers.state_made_on_one_rank_alone, 2).values():
        assert out["equal"]


def test_a_step_zero_checkpoint_resumes_as_no_checkpoint():
    """torchtitan saves before the first step: DMuon's state from it steps as a fresh one (its
    own zero-gradient step moved the AdamW step counter, shifting the bias correction)."""
    torch.manual_seed(0)
    models = [framework_models.TinyLM() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    containers = [dmuon_optimizers(adamw_lr=3e-3).build(model_parts=[m]) for m in models]
    saved = containers[1].state_dict()
    containers[1].load_state_dict(saved)
    for step in range(2):
        for model, container in zip(models, containers):
            model.loss(framework_models.batch(step)).backward()
            container.step()
            container.zero_grad()
    for p, q in zip(*(m.parameters() for m in models)):
        assert torch.equal(p, q)
    assert isinstance(containers[0].optimizers[0], dmuon.DMuon)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(fsdp, "DataParallelMeshDims"),
                    reason=f"torchtitan 0.3.0's Trainer imports torch.distributed.fsdp.DataParallelMeshDims, which "
                           f"torch {torch.__version__} lacks (bash scripts/run.sh test --torch newest runs it)")
def test_trainer_trains_the_debug_model_and_resumes_its_checkpoint_as_the_whole_run(tmp_path, monkeypatch):
    """The README's line in torchtitan's llama3_debugmodel config, its Trainer on 2 Gloo ranks
    (FSDP2): the loss falls below its first step's, and a run the Trainer resumes from its
    step-3 DCP checkpoint logs the same losses and ends with the same parameters, bit for bit."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # datasets' cache of the JSON dataset
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    torchtitan_workers.write_trainer_assets(str(tmp_path))
    whole = run_distributed(torchtitan_workers.train_debug_model, 2, str(tmp_path), "whole", None,
                            fresh=True, timeout_s=600)
    resumed = run_distributed(torchtitan_workers.train_debug_model, 2, str(tmp_path), "resumed", "whole",
                              fresh=True, timeout_s=600)
    steps, saved = torchtitan_workers.TRAINER_STEPS, torchtitan_workers.CHECKPOINT_STEP
    losses = whole[0]["losses"]
    assert sorted(losses) == list(range(1, steps + 1)) and all(map(math.isfinite, losses.values()))
    assert max(losses[s] for s in range(2, steps + 1)) < losses[1], losses
    assert whole[0]["optimizers"] == ["DMuon"] and whole[1]["losses"] == losses
    keys = dcp.FileSystemReader(str(tmp_path / "whole" / "checkpoint" / f"step-{saved}")).read_metadata().state_dict_metadata
    assert "optimizer.state.layers.0.attention.qkv_linear.wqkv.weight.momentum_buffer" in keys  # DMuon's, by FQN
    assert resumed[0]["losses"] == {s: losses[s] for s in range(saved + 1, steps + 1)}
    params, resumed_params = whole[0]["params"], resumed[0]["params"]
    assert params.keys() == resumed_params.keys()
    assert all(np.array_equal(params[n], resumed_params[n]) for n in params)
