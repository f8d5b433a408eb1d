"""`python3 lab/reports/fake_compare.py FILE`: what scripts/device_fake_world.sh prints last —
its stages, the error of each projected figure of `bench step --fake-world` against the step
measured on real GPUs, and the projected table at larger world sizes.

FILE holds {"stages": [[name, status, seconds], ...], "records": {name: bench step JSON}};
records are named step_<model>_w<world>[_depth1|_hsdp] (bench step --fake-world) and
e2e_<model>_w<world> (bench e2e --fake-world). Missing or failed records are reported, not
fatal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Measured on real H200s over NCCL (the multi-GPU runs on four and two H200s: BENCHMARKS.md
# "Distributed optimizer step", every row in `git show b1c84d7:docs/benchmarks/history.md`;
# slowest rank, median of 5 steps, bf16 wire, 64 MiB buckets; ms). "step": the default pipeline of today
# (depth 2 x world, call 3 of the 4-GPU run); "depth1": DMUON_PIPELINE_DEPTH=1, the pipeline
# of the 4-GPU run's depth-1 rows and of the whole 2-GPU run (commit 53cc655).
MEASURED = {
    ("qwen2.5-7b", 4, "step"): {"owner": 212.7, "gather": 624.9, "adamw": 20.9, "ns": 137.3},
    ("qwen2.5-7b", 4, "depth1"): {"owner": 332.3, "ns": 135.9},
    ("qwen2.5-1.5b", 4, "step"): {"owner": 37.0, "gather": 89.4, "adamw": 7.1, "ns": 22.6},
    ("qwen2.5-7b", 2, "depth1"): {"owner": 382.1, "gather": 630.6, "adamw": 31.2, "ns": 281.3},
    ("qwen2.5-1.5b", 2, "depth1"): {"owner": 62.8, "gather": 88.6, "adamw": 9.6, "ns": 41.3},
}
_WORLD2_NOTE = "world 2 was measured with the depth-1 pipeline only, and is projected with it"


def _parse(name: str) -> tuple[str, int, str] | None:
    """(model, world, variant) of a record name step_<model>_w<world>[_depth1|_hsdp]."""
    if not name.startswith("step_"):
        return None
    rest = name[len("step_"):]
    variant = "step"
    for suffix in ("_depth1", "_hsdp"):
        if rest.endswith(suffix):
            variant, rest = suffix[1:], rest[: -len(suffix)]
    model, _, world = rest.rpartition("_w")
    return (model, int(world), variant) if world.isdigit() else None


def _projected(record: dict) -> dict:
    methods = record.get("methods", {})
    out = {m: methods[m]["projected_step_ms"] for m in ("owner", "gather", "adamw") if m in methods}
    planner = record.get("planner_prediction") or {}
    if planner.get("measured_ns_ms") is not None:
        out["ns"] = planner["measured_ns_ms"]
        out["predicted_ns"] = planner.get("predicted_ns_ms")
    return out


def _error(projected: float | None, measured: float | None) -> str:
    if projected is None or measured is None:
        return f"{'-':>8}"
    return f"{(projected - measured) / measured * 100:+7.1f}%"


def compare(records: dict) -> None:
    """Projected against measured, per model, world and pipeline."""
    print("projection vs measured (the multi-GPU runs on H200s, BENCHMARKS.md; ms; "
          "error = projected/measured - 1)")
    header = f"{'model':<14} {'world':>5} {'pipeline':<9} {'figure':<8} {'projected':>10} {'measured':>9} {'error':>8}"
    print(header)
    print("-" * len(header))
    for (model, world, variant), measured in MEASURED.items():
        name = f"step_{model}_w{world}" + ("" if variant == "step" else f"_{variant}")
        record = records.get(name)
        if record is None or "methods" not in record:
            print(f"{model:<14} {world:>5} {variant:<9} (no record {name})")
            continue
        projected = _projected(record)
        for figure, value in measured.items():
            label = "NS slow" if figure == "ns" else figure
            p = projected.get(figure)
            print(f"{model:<14} {world:>5} {variant:<9} {label:<8} {p if p is not None else float('nan'):10.1f} "
                  f"{value:9.1f} {_error(p, value)}")
    print(f"NS slow: the measured NS of the planner's slowest rank on the fake rank against the real run's; "
          f"{_WORLD2_NOTE}")
    print()


def scale_table(records: dict) -> None:
    """The projected step at every world size the records hold beyond the measured ones."""
    rows = []
    for name, record in records.items():
        parsed = _parse(name)
        if parsed is None or "methods" not in record or parsed[2] == "depth1" or parsed[1] <= 4:
            continue
        rows.append((parsed, record))
    if not rows:
        return
    print("projected optimizer step, FSDP2 layout (ms; HSDP: replicas of one 8-GPU node's sharding)")
    header = (f"{'model':<14} {'world':>5} {'hsdp':>5} {'owner':>8} {'gather':>8} {'adamw':>7} {'vs gather':>10} "
              f"{'x AdamW':>8} {'pred NS':>8} {'meas NS':>8} {'GB sent':>8}")
    print(header)
    print("-" * len(header))
    for (model, world, variant), record in sorted(rows, key=lambda item: (item[0][0], item[0][1], item[0][2])):
        p = _projected(record)
        owner, gather, adamw = p.get("owner"), p.get("gather"), p.get("adamw")
        hsdp = record.get("hsdp", {}).get("replicas", 1)
        sent = record["methods"].get("owner", {}).get("send_bytes", 0) / 1e9
        fmt = lambda v: f"{v:8.1f}" if v is not None else f"{'-':>8}"  # noqa: E731
        versus = f"{gather / owner:9.2f}x" if owner and gather else f"{'-':>10}"
        times = f"{owner / adamw:7.2f}x" if owner and adamw else f"{'-':>8}"
        print(f"{model:<14} {world:>5} {hsdp:>5} {fmt(owner)} {fmt(gather)} {adamw or 0:7.1f} {versus} {times} "
              f"{fmt(p.get('predicted_ns'))} {fmt(p.get('ns'))} {sent:8.2f}")
    first = rows[0][1].get("topology", {})
    print(f"topology: {first.get('gpus_per_node')} GPUs per node, {first.get('intra_GBps', 0):.0f} GB/s inside, "
          f"{first.get('inter_GBps', 0):.1f} GB/s per GPU between nodes; pred/meas NS: the planner's NS of its "
          "slowest rank and that rank's NS measured on the fake rank")
    print()


def e2e_table(records: dict) -> None:
    """The projected training steps (bench e2e --fake-world records, named e2e_*)."""
    for name, record in sorted(records.items()):
        if not name.startswith("e2e_") or "optimizers" not in record:
            continue
        config = record.get("config", {})
        print(f"projected training step: {record['model']} at fake world {record['world']}, rank {record['rank']}, "
              f"micro-batch {config.get('micro_batch')} x seq {config.get('seq')} (ms)")
        print(f"{'optimizer':<10} {'fwd+bwd':>9} {'projected':>10} {'opt':>8} {'projected':>10} {'step':>9} "
              f"{'vs AdamW':>9}")
        optimizers = record["optimizers"]
        adamw = optimizers.get("adamw", {}).get("projected_step_ms")
        for opt, o in optimizers.items():
            versus = f"{(o['projected_step_ms'] - adamw) / adamw * 100:+8.2f}%" if adamw else f"{'-':>9}"
            print(f"{opt:<10} {o['fwd_bwd_ms']:9.1f} {o['fwd_bwd_projected_ms']:10.1f} {o['opt_ms']:8.1f} "
                  f"{o['opt_projected_ms']:10.1f} {o['projected_step_ms']:9.1f} {versus}")
        print()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python3 lab/reports/fake_compare.py FILE", file=sys.stderr)
        return 2
    try:
        data = json.loads(Path(argv[0]).read_text())
    except (OSError, ValueError) as error:
        print(f"fake_compare: cannot read {argv[0]}: {error}", file=sys.stderr)
        return 2
    print("== summary ==")
    for stage in data.get("stages", []):
        if len(stage) >= 3:
            print(f"{stage[0]:<40} {stage[1]:<26} {stage[2]:>5} s")
    print()
    records = data.get("records", {})
    compare(records)
    scale_table(records)
    e2e_table(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
