"""One training run: a fresh model, one optimizer, the shared data order -> RunResult."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from dmuon.cli.train.checkpoints import checkpoint_dir, resume_run, save_run
from dmuon.cli.train.config import TrainConfig
from dmuon.cli.train.data import Corpus, eval_batches, sample_batch
from dmuon.cli.train.model import build_model, loss_fn
from dmuon.cli.train.optim import build_optimizer, build_scheduler
from dmuon.cli.train.parallel import is_main_rank, local_slice, mean_over_ranks, wrap_model

# NOTE: the first optimizer steps allocate state (and, for dmuon, may plan/tune), so they
# are left out of the step-time statistics.
_STEP_TIME_WARMUP = 5
# Window (in steps) of the moving average reported as the final training loss.
_TRAIN_LOSS_WINDOW = 50


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What one run measured. Losses are mean next-byte cross-entropy in nats."""

    optimizer: str
    num_params: int
    train_losses: list[float]  # one per step
    val_steps: list[int]  # steps after which val loss was measured (0 = before training)
    val_losses: list[float]
    final_val_loss: float
    final_train_loss: float  # mean over the last min(_TRAIN_LOSS_WINDOW, steps) steps
    tokens_per_s: float  # training tokens / training-loop time (evaluation excluded)
    step_time_median_ms: float  # optimizer.step() wall time, after warm-up steps
    step_time_mean_ms: float
    train_time_s: float
    total_time_s: float  # training + evaluation
    lrs: list[float] = field(default_factory=list)  # lr of param_groups[0] at each step

    def to_dict(self) -> dict:
        return asdict(self)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, device: torch.device) -> float:
    """Token-weighted mean loss of `model` over fixed (inputs, targets) batches."""
    was_training = model.training
    model.eval()
    total_loss, total_tokens = 0.0, 0
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        loss = loss_fn(model(inputs), targets)
        total_loss += float(loss) * targets.numel()
        total_tokens += targets.numel()
    model.train(was_training)
    return total_loss / total_tokens


def run_training(config: TrainConfig, optimizer_name: str, corpus: Corpus) -> RunResult:
    """Train a fresh model (seeded init) with `optimizer_name` on the seeded batch order.
    Under torch.distributed every rank calls this; each trains on its slice of every
    global batch and rank 0's progress bar shows the loss averaged over ranks. With
    config.resume it continues from the run's checkpoint (checkpoints.py), and with
    config.checkpoint_every it saves one."""
    device = torch.device(config.resolved_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {config.device!r} requested but CUDA is not available")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())

    # Same init, same data order, same eval set for every optimizer (and every rank).
    model = wrap_model(build_model(config).to(device), config)
    optimizer = build_optimizer(optimizer_name, model, config)
    scheduler = build_scheduler(optimizer, config)
    generator = torch.Generator().manual_seed(config.seed + 1)
    val_set = eval_batches(
        corpus.val, batch_size=config.batch_size, seq_len=config.seq_len,
        max_batches=config.eval_max_batches,
    )

    # A fresh start (val loss of the untrained model), or the run's latest checkpoint.
    directory = checkpoint_dir(config.out_dir, optimizer_name)
    history = {"step": 0, "train_losses": [], "lrs": [], "val_steps": [], "val_losses": []}
    if config.resume:
        history = resume_run(directory, model, optimizer, scheduler, generator, history)
        if history["step"] >= config.steps:
            raise ValueError(f"steps: the checkpoint at {directory} is at step {history['step']}; "
                             f"--steps {config.steps} leaves nothing to train")
    else:
        history["val_steps"], history["val_losses"] = [0], [evaluate(model, val_set, device)]
    first_step = history["step"]
    train_losses, lrs = history["train_losses"], history["lrs"]
    val_steps, val_losses = history["val_steps"], history["val_losses"]
    step_times: list[float] = []
    eval_time = 0.0
    start = time.perf_counter()

    progress = tqdm(
        range(first_step, config.steps), initial=first_step, total=config.steps, desc=f"{optimizer_name:>10}",
        disable=not (config.progress and is_main_rank()), dynamic_ncols=True, leave=True,
    )
    for step in progress:
        # Forward/backward on the next batch of the shared order.
        inputs, targets = sample_batch(
            corpus.train, batch_size=config.batch_size, seq_len=config.seq_len,
            generator=generator,
        )
        inputs, targets = local_slice(inputs), local_slice(targets)
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        if config.grad_clip > 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)

        # Timed optimizer step (synchronized on CUDA so the time is the step's own).
        _synchronize(device)
        step_start = time.perf_counter()
        optimizer.step()
        _synchronize(device)
        step_times.append(time.perf_counter() - step_start)
        optimizer.zero_grad(set_to_none=True)
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.step()

        # Record the loss; a non-finite loss ends the run with an error naming it.
        loss_value = mean_over_ranks(loss)
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"{optimizer_name}: loss is {loss_value} at step {step}")
        train_losses.append(loss_value)

        # Periodic validation (its time is excluded from tokens/s).
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            eval_start = time.perf_counter()
            val_steps.append(step + 1)
            val_losses.append(evaluate(model, val_set, device))
            eval_time += time.perf_counter() - eval_start
            progress.set_postfix(loss=f"{loss_value:.3f}", val=f"{val_losses[-1]:.3f}")
        elif step % 10 == 0:
            progress.set_postfix(loss=f"{loss_value:.3f}", val=f"{val_losses[-1]:.3f}")

        # Periodic checkpoint (and one at the last step).
        if config.checkpoint_every and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps):
            history["step"] = step + 1
            save_run(directory, model, optimizer, scheduler, generator, history)
    progress.close()

    # Summaries.
    _synchronize(device)
    total_time = time.perf_counter() - start
    train_time = total_time - eval_time
    timed = step_times[_STEP_TIME_WARMUP:] or step_times
    window = train_losses[-min(_TRAIN_LOSS_WINDOW, len(train_losses)) :]
    return RunResult(
        optimizer=optimizer_name,
        num_params=sum(p.numel() for p in model.parameters()),  # global sizes (DTensors too)
        train_losses=train_losses,
        val_steps=val_steps,
        val_losses=val_losses,
        final_val_loss=val_losses[-1],
        final_train_loss=sum(window) / len(window),
        tokens_per_s=(config.steps - first_step) * config.tokens_per_step / train_time,
        step_time_median_ms=1e3 * statistics.median(timed),
        step_time_mean_ms=1e3 * statistics.fmean(timed),
        train_time_s=train_time,
        total_time_s=total_time,
        lrs=lrs,
    )
