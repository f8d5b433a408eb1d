"""`bench ns --variants`: the variants' param groups (same parameters; the split ones run the
default's block shapes) and a CPU smoke run of the table on the tiny model."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from dmuon.cli.bench import ns, ns_variants


def _blocks(groups) -> Counter:
    """Matrix shapes Newton–Schulz sees: each shape cut by its group's split."""
    out: Counter = Counter()
    for shapes, options in groups:
        for rows, cols in shapes:
            if options.get("split_rows"):
                out.update((r, cols) for r in options["split_rows"])
            elif options.get("split_heads") and options.get("split_dim") == 1:
                out[(rows, cols // options["split_heads"])] += options["split_heads"]
            elif options.get("split_heads"):
                out[(rows // options["split_heads"], cols)] += options["split_heads"]
            else:
                out[(rows, cols)] += 1
    return out


@pytest.mark.parametrize("model", ["tiny", "qwen2.5-1.5b"])
def test_variants_hold_the_same_parameters_and_split_back_to_the_default_blocks(model):
    dims = ns.design_dims(model)
    default = ns_variants.default(dims)
    size = lambda groups: sum(r * c for shapes, _ in groups for r, c in shapes)  # noqa: E731
    for name, build in ns_variants.VARIANTS.items():
        assert size(build(dims)) == size(default), name
    assert _blocks(ns_variants.split_qkv(dims)) == _blocks(default)
    assert _blocks(ns_variants.split_gate_up(dims)) == _blocks(default)
    h, _, layers, heads, kv = dims
    assert _blocks(ns_variants.split_heads(dims))[(h // heads, h)] == layers * (heads + 2 * kv)
    assert _blocks(ns_variants.split_heads_o(dims))[(h, h // heads)] == layers * heads


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match=r"--variants: unknown variant\(s\) \['normuonx'\]"):
        ns_variants.parse_variants("split_qkv,normuonx")
    assert ns_variants.parse_variants("split_heads,default") == ["default", "split_heads"]


def test_cpu_table_times_every_variant(capsys, monkeypatch):
    monkeypatch.setattr(ns_variants.torch.cuda, "is_available", lambda: False)
    args = argparse.Namespace(model=["tiny"], variants="split_qkv,split_gate_up,split_heads,split_heads_o", warmup=1,
                              iters=1)
    ns_variants.run_variants(args, ns.design_dims)
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ns_variants.VARIANTS]
    assert [r[0] for r in rows] == ["default", "split_qkv", "split_gate_up", "split_heads", "split_heads_o"]
    assert all(float(r[2]) > 0 for r in rows)
