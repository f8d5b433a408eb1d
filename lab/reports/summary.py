"""`python3 lab/reports/summary.py DIR`: the short summary scripts/multigpu_run.sh prints
last — each stage's status and time (DIR/stages.tsv), the optimizer step per model and
world size (DIR/step_*.json from `bench step --json`) and the end-to-end step
(DIR/e2e_*.json from `bench e2e --json`). Missing or unreadable files are reported, not
fatal: the summary must survive a failed stage."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        print(f"  (unreadable {path.name}: {error})")
        return None


def _stages(folder: Path) -> None:
    path = folder / "stages.tsv"
    if not path.exists():
        return
    print(f"{'stage':<28} {'status':<28} {'seconds':>8}")
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            print(f"{parts[0]:<28} {parts[1]:<28} {parts[2]:>8}")
    print()


def _steps(folder: Path) -> None:
    files = sorted(folder.glob("step_*.json"))
    if not files:
        return
    print("optimizer step, FSDP2 layout, slowest rank (ms)")
    header = (f"{'model':<14} {'world':>5} {'owner':>8} {'gather':>8} {'adamw':>8} {'vs gather':>10} {'x AdamW':>8} "
              f"{'pred NS':>8} {'meas NS':>8} {'MB sent':>8}")
    print(header)
    for path in files:
        record = _load(path)
        if record is None:
            continue
        for world, data in record.get("worlds", {}).items():
            m = data["slowest_rank"]

            def ms(method, key="step_s"):
                return m[method][key] * 1e3 if method in m else float("nan")

            owner, gather, adamw = ms("owner"), ms("gather"), ms("adamw")
            predicted = (m["owner"]["predicted_ns_s"] or 0) * 1e3 if "owner" in m else float("nan")
            measured = m["owner"]["split_s"][3] * 1e3 if "owner" in m else float("nan")
            sent = m["owner"]["bytes_sent"] / 2**20 if "owner" in m else float("nan")
            print(f"{record['model']:<14} {world:>5} {owner:8.1f} {gather:8.1f} {adamw:8.1f} {gather / owner:9.2f}x "
                  f"{owner / adamw:7.2f}x {predicted:8.1f} {measured:8.1f} {sent:8.1f}")
        if record.get("skipped_worlds"):
            print(f"{'':<14} skipped worlds {record['skipped_worlds']} (not enough GPUs)")
    print()


def _e2e(folder: Path) -> None:
    for path in sorted(folder.glob("e2e_*.json")):
        record = _load(path)
        if record is None:
            continue
        config = record["config"]
        print(f"end-to-end {config['model']}: world {config['world']}, seq {config['seq']}, micro-batch "
              f"{record['micro_batch']} per rank (slowest rank, ms)")
        merged = record["slowest_rank"]
        adamw = merged.get("adamw", {}).get("step_s")
        print(f"{'optimizer':<10} {'step':>9} {'opt step':>9} {'vs AdamW':>9}")
        for name, e in merged.items():
            versus = f"{(e['step_s'] - adamw) / adamw * 100:+8.2f}%" if adamw else f"{'-':>9}"
            print(f"{name:<10} {e['step_s'] * 1e3:9.1f} {e['opt_s'] * 1e3:9.1f} {versus}")
        print()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python3 lab/reports/summary.py DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    if not folder.is_dir():
        print(f"summary: {folder} is not a directory", file=sys.stderr)
        return 2
    print("== summary ==")
    _stages(folder)
    _steps(folder)
    _e2e(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
