"""TrainConfig: every setting of one `python -m dmuon train` job, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Optimizers the job knows. "torch-muon" (torch.optim.Muon on the hidden matrices + AdamW on
# the rest) is a reference for dmuon, not part of the default comparison.
OPTIMIZER_NAMES = ("dmuon", "adamw", "torch-muon")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Settings of the job. Defaults finish both runs in ~3-4 minutes on 2 CPU cores."""

    # What to run.
    optimizers: tuple[str, ...] = ("dmuon", "adamw")
    # NOTE: 400 steps. Forward+backward is ~90-110 ms/step on 2 cores; on 2 pinned Xeon cores the
    # torch-muon + adamw defaults took 122 s in all (val 1.36 / 2.05 vs entropy 3.26). dmuon's
    # CPU step measured ~236 ms on the 2-core dev box (torch.optim.Muon ~20 ms), so the
    # default dmuon + adamw job is ~2-3.5 min on an idle 2-core CPU.
    steps: int = 400
    # "auto": every local GPU over NCCL when CUDA is present, else CPU processes over Gloo.
    device: str = "auto"
    seed: int = 0

    # Parallelism: `world` processes (0: all local GPUs with CUDA, else 2 CPU processes),
    # the model wrapped by FSDP2 (fully_shard per block) or DDP. The global batch
    # (batch_size) is split across ranks, so every world size sees the same data.
    world: int = 0
    parallel: str = "fsdp2"

    # Data.
    batch_size: int = 16
    seq_len: int = 128
    val_fraction: float = 0.1

    # Model (GPT, byte vocabulary).
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4

    # Optimization. lr is Muon's (dmuon's matrices, on AdamW's scale via match_rms_adamw);
    # adamw_lr is the AdamW baseline's and that of every run's AdamW parameters (embeddings,
    # lm_head, norms). NOTE: chosen by 600-step sweeps of these defaults (fp32, H200,
    # torch.optim.Muon as dmuon's stand-in, one run each), final val loss: Muon lr 5e-3 1.28,
    # 1e-2 1.25, 2e-2 1.25, 4e-2 1.39 (adamw_lr 3e-3); 1e-3 1.89, 2e-3 1.51, 3e-3 1.36
    # (adamw_lr = lr). AdamW lr 1e-3 1.99, 2e-3 1.77, 3e-3 1.77, 5e-3 1.77, 1e-2 1.85, 2e-2 2.28.
    lr: float = 1e-2
    adamw_lr: float = 3e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0

    # Evaluation and output.
    eval_every: int = 100
    eval_max_batches: int | None = None
    out_dir: Path = Path("runs/train")
    plot: bool = True
    progress: bool = True

    # Checkpoints (dmuon.checkpoint, under out_dir/checkpoints/<optimizer>): every
    # `checkpoint_every` steps and at the last step (0: none); `resume` continues each run
    # from its latest one.
    checkpoint_every: int = 0
    resume: bool = False

    def __post_init__(self) -> None:
        # Validate every field; each error names the bad argument.
        if not self.optimizers:
            raise ValueError("optimizers must name at least one optimizer")
        for name in self.optimizers:
            if name not in OPTIMIZER_NAMES:
                raise ValueError(f"optimizers: unknown optimizer {name!r}; known: {OPTIMIZER_NAMES}")
        if len(set(self.optimizers)) != len(self.optimizers):
            raise ValueError(f"optimizers must not repeat a name, got {self.optimizers}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.world < 0:
            raise ValueError(f"world must be >= 0 (0: automatic), got {self.world}")
        if self.parallel not in ("fsdp2", "ddp"):
            raise ValueError(f"parallel must be 'fsdp2' or 'ddp', got {self.parallel!r}")
        positive_ints = {
            "steps": self.steps,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "d_model": self.d_model,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "mlp_ratio": self.mlp_ratio,
            "eval_every": self.eval_every,
        }
        for field_name, value in positive_ints.items():
            if value < 1:
                raise ValueError(f"{field_name} must be >= 1, got {value}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0: no checkpoints), got {self.checkpoint_every}")
        if "torch-muon" in self.optimizers and (self.checkpoint_every or self.resume):
            raise ValueError("checkpoint_every/resume: 'torch-muon' (two torch optimizers under one "
                             "reference wrapper) has no state dict to checkpoint; drop it or the checkpoint options")
        if self.eval_max_batches is not None and self.eval_max_batches < 1:
            raise ValueError(f"eval_max_batches must be >= 1 or None, got {self.eval_max_batches}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        for field_name, value in (("lr", self.lr), ("adamw_lr", self.adamw_lr)):
            if not value > 0.0:
                raise ValueError(f"{field_name} must be > 0, got {value}")
        if self.weight_decay < 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two values in [0, 1), got {self.betas}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0.0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")

    def resolved_device(self) -> str:
        """device with "auto" made concrete: "cuda" when CUDA is present, else "cpu"."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def resolved(self) -> "TrainConfig":
        """The config with device and world made concrete for this machine."""
        import dataclasses

        import torch

        device = self.resolved_device()
        world = self.world or (torch.cuda.device_count() if device.startswith("cuda") else 2)
        if world > 1 and device.startswith("cuda:"):
            raise ValueError(f"device {device!r} names one GPU; use device 'cuda' with world {world}")
        if self.batch_size % world:
            raise ValueError(f"batch_size {self.batch_size} must be divisible by world {world}")
        if world > 1 and "torch-muon" in self.optimizers:
            raise ValueError("optimizers: 'torch-muon' (torch.optim.Muon) runs on one process only; "
                             "use --world 1 or drop it")
        return dataclasses.replace(self, device=device, world=world)

    @property
    def tokens_per_step(self) -> int:
        """Training tokens consumed by one optimizer step."""
        return self.batch_size * self.seq_len
