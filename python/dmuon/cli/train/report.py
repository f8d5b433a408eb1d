"""Results out: the plain-text table, the JSON record and the PNG of the loss curves."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from dmuon.cli.bench import environment
from dmuon.cli.train.config import TrainConfig
from dmuon.cli.train.loop import RunResult

# Columns of the final table: (header, formatter of one RunResult).
_COLUMNS = (
    ("optimizer", lambda r: r.optimizer),
    ("val loss", lambda r: f"{r.final_val_loss:.4f}"),
    ("train loss", lambda r: f"{r.final_train_loss:.4f}"),
    ("tokens/s", lambda r: f"{r.tokens_per_s:,.0f}"),
    ("opt step median (ms)", lambda r: f"{r.step_time_median_ms:.2f}"),
    ("opt step mean (ms)", lambda r: f"{r.step_time_mean_ms:.2f}"),
    ("total time (s)", lambda r: f"{r.total_time_s:.1f}"),
)


def format_table(results: Sequence[RunResult], *, entropy: float) -> str:
    """Aligned plain-text table of the runs, then the unigram-entropy verdict of each run."""
    rows = [[header for header, _ in _COLUMNS]]
    rows += [[fmt(result) for _, fmt in _COLUMNS] for result in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]

    # Header, rule, rows: the first column left-aligned, numbers right-aligned.
    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        return "  ".join(cells)

    lines = [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]
    lines.append(f"unigram (byte) entropy of the train split: {entropy:.4f} nats")
    for result in results:
        verdict = "beat it" if result.final_val_loss < entropy else "did NOT beat it"
        lines.append(
            f"  {result.optimizer}: val loss {result.final_val_loss:.4f} {verdict} "
            f"({result.final_val_loss - entropy:+.4f} nats)"
        )
    return "\n".join(lines)


def write_json(
    path: Path, *, config: TrainConfig, entropy: float, results: Sequence[RunResult]
) -> None:
    """Everything measured, with the config that produced it (written whole or not at all)."""
    record = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(config).items()},
        "unigram_entropy_nats": entropy,
        "results": {r.optimizer: {**r.to_dict(), "beat_unigram": r.final_val_loss < entropy} for r in results},
    }
    environment.write_json(path, record)


def plot_losses(path: Path, *, results: Sequence[RunResult], entropy: float) -> None:
    """PNG: per-step training loss (light), its moving average, val loss points, the entropy line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for idx, result in enumerate(results):
        color = f"C{idx}"
        steps = range(1, len(result.train_losses) + 1)
        ax.plot(steps, result.train_losses, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(steps, _moving_average(result.train_losses, 20), color=color,
                label=f"{result.optimizer} train (avg 20)")
        ax.plot(result.val_steps, result.val_losses, "o--", color=color, markersize=4,
                label=f"{result.optimizer} val")
    ax.axhline(entropy, color="gray", linestyle=":", label=f"unigram entropy {entropy:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title("byte-level GPT on pydoc_data.topics")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
