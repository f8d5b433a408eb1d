"""`python -m dmuon train`: argument parsing and the job's top level."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dmuon.cli.train.config import OPTIMIZER_NAMES, TrainConfig

_DEFAULTS = TrainConfig()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `train` subcommand to `subparsers`."""
    parser = subparsers.add_parser(
        "train",
        help="train a small byte-level GPT with dmuon and AdamW and compare them",
        description="Train a small GPT on pydoc_data.topics (byte level) with each optimizer "
        "from the same init and data order; print a table, write JSON and a PNG plot.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = _DEFAULTS
    parser.add_argument("--optimizers", default=",".join(d.optimizers),
                        help=f"comma-separated, from {','.join(OPTIMIZER_NAMES)}")
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--seq-len", type=int, default=d.seq_len)
    parser.add_argument("--d-model", type=int, default=d.d_model)
    parser.add_argument("--layers", type=int, default=d.num_layers)
    parser.add_argument("--heads", type=int, default=d.num_heads)
    parser.add_argument("--lr", type=float, default=d.lr, help="dmuon's peak lr (Muon matrices)")
    parser.add_argument("--adamw-lr", type=float, default=d.adamw_lr,
                        help="AdamW's peak lr (the baseline, and every run's AdamW parameters)")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay)
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    parser.add_argument("--device", default=d.device, help="auto | cpu | cuda | cuda:N (auto: cuda when present)")
    parser.add_argument("--world", type=int, default=d.world,
                        help="processes: 0 = every local GPU with CUDA, else 2 CPU processes over Gloo")
    parser.add_argument("--parallel", choices=("fsdp2", "ddp"), default=d.parallel,
                        help="how the model is wrapped when world > 1")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--out", type=Path, default=d.out_dir, help="directory for JSON and PNG")
    parser.add_argument("--eval-every", type=int, default=d.eval_every)
    parser.add_argument("--eval-max-batches", type=int, default=d.eval_max_batches,
                        help="cap on validation batches (default: the whole val split)")
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                        help="save every N steps and at the last (0: never) into OUT/checkpoints/<optimizer>")
    parser.add_argument("--resume", action="store_true",
                        help="continue each optimizer's run from its checkpoint in OUT/checkpoints/<optimizer>")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


# Arguments whose parsed name is the TrainConfig field's; the others are mapped below.
_SAME_NAMES = ("steps", "device", "world", "parallel", "seed", "batch_size", "seq_len", "d_model", "lr", "adamw_lr",
               "weight_decay", "warmup_steps", "eval_every", "eval_max_batches", "checkpoint_every", "resume")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """TrainConfig from parsed arguments (validation errors name the field)."""
    return TrainConfig(
        optimizers=tuple(name.strip() for name in args.optimizers.split(",") if name.strip()),
        num_layers=args.layers,
        num_heads=args.heads,
        out_dir=args.out,
        plot=not args.no_plot,
        progress=not args.no_progress,
        **{name: getattr(args, name) for name in _SAME_NAMES},
    )


def _train_all(rank: int, world: int, config: TrainConfig) -> list | None:
    """Every optimizer's run on this rank; rank 0 returns the results."""
    from dmuon.cli.train.data import load_corpus
    from dmuon.cli.train.loop import run_training

    corpus = load_corpus(val_fraction=config.val_fraction)
    results = [run_training(config, name, corpus) for name in config.optimizers]
    return results if rank == 0 else None


def run(args: argparse.Namespace) -> int:
    """The job: every optimizer from the same start, then table, JSON and plot."""
    from dmuon.cli.launch import launch
    from dmuon.cli.train.data import load_corpus, unigram_entropy
    from dmuon.cli.train.report import format_table, plot_losses, write_json

    try:
        config = config_from_args(args).resolved()
    except ValueError as error:
        print(f"python -m dmuon train: error: {error}", file=sys.stderr)
        return 2
    corpus = load_corpus(val_fraction=config.val_fraction)
    entropy = unigram_entropy(corpus.train)
    print(
        f"data: {len(corpus.train):,} train / {len(corpus.val):,} val bytes "
        f"(pydoc_data.topics); unigram entropy {entropy:.4f} nats",
        flush=True,
    )

    # One run per optimizer, in the order given: in this process, or on `world` ranks.
    if config.world == 1:
        results = _train_all(0, 1, config)
    else:
        backend = "nccl" if config.device.startswith("cuda") else "gloo"
        print(f"parallel: {config.world} processes over {backend.upper()}, model wrapped by "
              f"{config.parallel.upper()}", flush=True)
        results = launch(_train_all, config.world, config, backend=backend, timeout_s=24 * 3600)[0]
    print(
        f"model: {results[0].num_params:,} params, d_model {config.d_model}, "
        f"{config.num_layers} layers, {config.num_heads} heads, seq {config.seq_len}, "
        f"batch {config.batch_size}, {config.steps} steps on {config.device} x{config.world}"
    )
    print(format_table(results, entropy=entropy))

    # Artifacts.
    config.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = config.out_dir / "results.json"
    write_json(json_path, config=config, entropy=entropy, results=results)
    print(f"wrote {json_path}")
    if config.plot:
        png_path = config.out_dir / "loss.png"
        plot_losses(png_path, results=results, entropy=entropy)
        print(f"wrote {png_path}")
    sys.stdout.flush()
    return 0
