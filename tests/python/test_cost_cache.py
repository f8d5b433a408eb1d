"""The NS cost cache is never trusted: a corrupt, truncated or edited file is ignored with
exactly one warning and re-measured; a file of another device or dmuon version is
re-measured; concurrent writers never leave a torn file. A fake clock makes every measured
run take a known time, so that the values that come back show where they came from."""

from __future__ import annotations

import multiprocessing as mp
import warnings

import pytest

from dmuon.plan import native
from dmuon.plan.profile import cache_key, profile_cost_table

POINTS = [(8, 12, 1), (8, 12, 2), (5, 7, 1)]
# NOTE: what a corrupt file held (the last one is the number whose cut the issue found read
# as 5.47 s), and what every re-measured run takes under the fake clock (exact in binary).
STORED = [2.5e-05, 4.75e-05, 5.4672999795002397e-05]
MEASURED_S = 2.0**-14


class _Clock:
    """time for dmuon.plan.profile: each perf_counter() call is MEASURED_S after the last,
    so that every timed run takes exactly MEASURED_S."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += MEASURED_S
        return self.now


@pytest.fixture
def fake_clock(monkeypatch):
    import dmuon.plan.profile as profile

    monkeypatch.setattr(profile, "time", _Clock())


def _key() -> str:
    import torch

    return cache_key(torch.device("cpu"), "gram", 5)


def _profile(path):
    return profile_cost_table(POINTS, device="cpu", num_runs=1, num_warmup=0, cache_path=str(path))


def _written_for(path, key: str) -> str:
    """A valid cache of STORED under `key`, as profile_cost_table writes it; its text."""
    table = native().CostTable()
    for (rows, cols, n), seconds in zip(sorted(POINTS), STORED):
        table.set(rows, cols, n, seconds)
    table.save(str(path), key)
    return path.read_text()


def _stored_file(path) -> str:
    return _written_for(path, _key())


def _entries(table) -> list[tuple]:
    return sorted(table.entries())


def _valid(path) -> bool:
    table = native().CostTable()
    return table.load(str(path), _key()) and len(table) == len(POINTS)


def _cut_inside_last_number(text: str) -> str:
    # 5.4672999795002397e-05 -> 5.4672999795002397: the rest of the file is lost with it
    return text[: text.rindex("e-05")] + "\n"


def _changed_digit(text: str) -> str:
    at = text.index("4.75")
    return text[:at] + "9" + text[at + 1:]


@pytest.mark.parametrize("corrupt", [
    lambda text: "garbage\nnot a table\n",
    lambda text: "dmuon-cost-table v2\nkey",                            # truncated in the header
    _cut_inside_last_number,                                            # truncated mid-number
    lambda text: text[: len(text) - 5],                                 # truncated in the end line
    lambda text: text[: text.index("\nend ") + 1],                      # the end line lost
    _changed_digit,                                                     # edited
    lambda text: text.replace("v2", "v1").split("end ")[0],             # the previous format
], ids=["garbage", "truncated-header", "truncated-number", "truncated-end-line", "no-end-line", "edited",
        "old-format"])
def test_corrupt_cache_is_ignored_with_one_warning_and_remeasured(tmp_path, fake_clock, corrupt):
    path = tmp_path / "costs.txt"
    path.write_text(corrupt(_stored_file(path)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = _profile(path)
    messages = [str(w.message) for w in caught if "cost cache" in str(w.message)]
    assert len(messages) == 1 and str(path) in messages[0], messages
    # Every value is this run's measurement (none of the file's), and the file now holds them.
    assert _entries(table) == [(r, c, n, MEASURED_S) for r, c, n in sorted(POINTS)]
    rewritten = native().CostTable()
    assert rewritten.load(str(path), _key()) and _entries(rewritten) == _entries(table)


def test_valid_cache_is_used_as_written_without_a_warning(tmp_path, fake_clock):
    path = tmp_path / "costs.txt"
    _stored_file(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = _profile(path)
    assert not [w for w in caught if "cost cache" in str(w.message)]
    assert _entries(table) == [(r, c, n, s) for (r, c, n), s in zip(sorted(POINTS), STORED)]


@pytest.mark.parametrize("where", ["key cpu", "dmuon "], ids=["device", "dmuon-version"])
def test_cache_of_another_device_or_dmuon_version_is_remeasured_without_a_warning(tmp_path, fake_clock, where):
    from dmuon import _C

    path = tmp_path / "costs.txt"
    other = _key().replace("cpu", "NVIDIA H200", 1) if where == "key cpu" else _key().replace(
        f"dmuon {_C.__version__}", "dmuon 0.0.1")
    assert other != _key()
    _written_for(path, other)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = _profile(path)
    assert not [w for w in caught if "cost cache" in str(w.message)]  # not corrupt, only not ours
    assert _entries(table) == [(r, c, n, MEASURED_S) for r, c, n in sorted(POINTS)]
    assert _valid(path) and f"key {_key()}" in path.read_text()  # rewritten for this device


@pytest.mark.slow
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
