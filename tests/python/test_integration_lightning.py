"""dmuon.integrations.lightning against the real Lightning (tests/requirements.txt): the
recipe trains with a scheduler and gradient clipping, checkpoints and resumes to the
uninterrupted model."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

import dmuon  # noqa: E402
import dmuon.integrations.lightning as dmuon_lightning  # noqa: E402
import framework_models  # noqa: E402
from dmuon.integrations import unwrap  # noqa: E402


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lm = framework_models.TinyLM()

    def training_step(self, batch, batch_idx):
        return self.lm.loss(batch[0])

    def configure_optimizers(self):
        return dmuon_lightning.configure_optimizers(
            self, lr=0.02, adamw_lr=3e-3, scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, 6))


def fit(root, max_steps: int, ckpt_path=None) -> tuple[Model, "L.Trainer"]:
    # NOTE: 3 batches an epoch, a checkpoint every 3 steps: Lightning resumes a plain
    # DataLoader at the start of an epoch.
    data = DataLoader(TensorDataset(torch.cat([framework_models.batch(i) for i in range(3)])), batch_size=4)
    model = Model()
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=root, every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, gradient_clip_val=0.5, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoints],
                        default_root_dir=root)
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return model, trainer


def test_recipe_trains_clips_and_resumes_to_the_uninterrupted_model(tmp_path):
    whole, trainer = fit(tmp_path / "whole", 6)
    optimizer = unwrap(whole.optimizers())
    assert isinstance(optimizer, dmuon.DMuon) and optimizer.param_groups[0]["num_steps"] == 6
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.02, 3e-3]
    assert optimizer.param_groups[0]["lr"] < 0.02  # the scheduler stepped
    saved = sorted((tmp_path / "whole").glob("*step=3.ckpt"))
    assert saved, list((tmp_path / "whole").iterdir())
    resumed, _ = fit(tmp_path / "resumed", 6, ckpt_path=str(saved[0]))
    for (name, p), q in zip(whole.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name


def test_interval_is_checked():
    with pytest.raises(ValueError, match="interval must be 'step' or 'epoch', got 'batch'"):
        dmuon_lightning.configure_optimizers(framework_models.TinyLM(), interval="batch")
