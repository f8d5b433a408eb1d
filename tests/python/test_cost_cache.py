"""The NS cost cache is never trusted: a corrupt, truncated or foreign file is ignored with
one warning and rebuilt; concurrent writers never leave a torn file."""

from __future__ import annotations

import multiprocessing as mp
import warnings

import pytest

from dmuon.plan import native
from dmuon.plan.profile import cache_key, profile_cost_table

POINTS = [(8, 12, 1), (8, 12, 2), (5, 7, 1)]


def _profile(path):
    return profile_cost_table(POINTS, device="cpu", num_runs=1, num_warmup=0, cache_path=str(path))


def _valid(path) -> bool:
    import torch

    table = native().CostTable()
    return table.load(str(path), cache_key(torch.device("cpu"), "gram", 5)) and len(table) == len(POINTS)


@pytest.mark.parametrize("content", [
    "garbage\nnot a table\n",
    "dmuon-cost-table v1\nkey",                        # truncated in the header
    None,                                              # truncated mid-line (filled below)
], ids=["corrupt", "truncated-header", "truncated-line"])
def test_corrupt_or_truncated_cache_is_ignored_with_one_warning_and_rebuilt(tmp_path, content):
    path = tmp_path / "costs.txt"
    if content is None:
        _profile(path)
        text = path.read_text()
        content = text[: len(text) - 5]  # cut the last line short
    path.write_text(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = _profile(path)
    assert len(table) == len(POINTS)
    messages = [str(w.message) for w in caught if "cost cache" in str(w.message)]
    assert len(messages) <= 1 and _valid(path)
    if content.startswith("garbage"):
        assert len(messages) == 1


def test_cache_of_another_device_is_not_used(tmp_path):
    path = tmp_path / "costs.txt"
    _profile(path)
    path.write_text(path.read_text().replace("key cpu", "key NVIDIA H200"))
    table = _profile(path)
    assert len(table) == len(POINTS) and _valid(path)  # re-measured and rewritten for this device


def test_concurrent_writers_never_leave_a_torn_file(tmp_path):
    path = str(tmp_path / "costs.txt")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_profile, args=(path,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert _valid(path)


def test_cache_of_another_dmuon_version_is_not_used(tmp_path):
    from dmuon import _C

    path = tmp_path / "costs.txt"
    _profile(path)
    path.write_text(path.read_text().replace(f"dmuon {_C.__version__}", "dmuon 0.0.1"))
    table = _profile(path)
    assert len(table) == len(POINTS) and _valid(path)
    assert f"dmuon {_C.__version__}" in path.read_text()
