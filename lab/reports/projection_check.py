"""`python3 lab/reports/projection_check.py DIR`: the fake-world projection against the run
measured on real GPUs in the same call (scripts/multigpu_run.sh, stage `project`).

DIR holds the JSON records of that call:
  step_<model>.json           bench step --worlds W1,W2,…   (measured; "worlds": {W: {"slowest_rank": …}})
  fake_step_<model>_w<W>.json bench step --fake-world W     (projected; "methods": {m: {"projected_step_ms"}})
  e2e_<model>.json            bench e2e --world auto        (measured; "config": {"world"}, "slowest_rank")
  fake_e2e_<model>_w<W>.json  bench e2e --fake-world W      (projected; "optimizers": {o: {"projected_step_ms"}})
Each figure present on both sides is printed with its error (projected / measured − 1);
a record missing or unreadable on one side is named, not fatal.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_FAKE = re.compile(r"^fake_(step|e2e)_(.+)_w(\d+)\.json$")


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def measured_step(record: dict, world: int) -> dict:
    """Slowest-rank step ms per method of a `bench step --worlds` record at `world`."""
    entry = record.get("worlds", {}).get(str(world), {}).get("slowest_rank", {})
    return {m: e["step_s"] * 1e3 for m, e in entry.items() if "step_s" in e}


def measured_e2e(record: dict, world: int) -> dict:
    """Slowest-rank training step ms per optimizer of a `bench e2e` record, if it ran at `world`."""
    if int(record.get("config", {}).get("world", -1)) != world:
        return {}
    return {o: e["step_s"] * 1e3 for o, e in record.get("slowest_rank", {}).items() if "step_s" in e}


def projected(kind: str, record: dict) -> dict:
    """Projected ms per method (step) or optimizer (e2e) of a fake-world record."""
    table = record.get("methods" if kind == "step" else "optimizers", {})
    return {name: e["projected_step_ms"] for name, e in table.items() if "projected_step_ms" in e}


def rows(directory: Path) -> tuple[list[tuple], list[str]]:
    """(kind, model, world, figure, projected ms, measured ms) for every pair found, and
    the names of the records that had no counterpart."""
    out, missing = [], []
    for path in sorted(directory.glob("fake_*.json")):
        match = _FAKE.match(path.name)
        if match is None:
            continue
        kind, model, world = match.group(1), match.group(2), int(match.group(3))
        fake = _load(path)
        real_path = directory / f"{kind}_{model}.json"
        real = _load(real_path) if real_path.exists() else None
        if fake is None or real is None:
            missing.append(path.name if fake is None else real_path.name)
            continue
        measured = measured_step(real, world) if kind == "step" else measured_e2e(real, world)
        if not measured:
            missing.append(f"{real_path.name} at world {world}")
        for figure, p in projected(kind, fake).items():
            if figure in measured:
                out.append((kind, model, world, figure, p, measured[figure]))
    return out, missing


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python3 lab/reports/projection_check.py DIR (a directory of bench JSON records)",
              file=sys.stderr)
        return 2
    found, missing = rows(Path(argv[0]))
    print("fake-world projection vs measured in the same call (ms, slowest rank; error = projected / measured - 1)")
    header = f"{'bench':<5} {'model':<14} {'world':>5} {'figure':<16} {'projected':>10} {'measured':>9} {'error':>8}"
    print(header)
    print("-" * len(header))
    for kind, model, world, figure, p, m in found:
        print(f"{kind:<5} {model:<14} {world:>5} {figure:<16} {p:10.1f} {m:9.1f} {(p - m) / m * 100:+7.1f}%")
    if not found:
        print("(no pair of a fake-world record and a measured one)")
    for name in missing:
        print(f"no counterpart: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
