"""The measurement store of the NS cost table (the autotune cache's format) through the
public binding the CLI uses (``dmuon.cli.plan.profile.profile_cost_table``, the engine's own
timing on the CPU ops here): a store is never trusted — a corrupt, truncated or edited file
is ignored with exactly one warning and re-measured; a valid one is read as written;
concurrent writers never leave a torn file. (Every truncation and changed character, the
stale environment and the timing itself: tests/cpp/test_autotune_cache.cpp,
tests/cpp/test_cost_profile.cpp.)"""

from __future__ import annotations

import multiprocessing as mp
import shutil

import pytest

from dmuon.cli.plan.profile import profile_cost_table

POINTS = [(8, 12, 1), (8, 12, 2), (5, 7, 1)]


def _profile(path):
    return profile_cost_table(POINTS, device="cpu", num_runs=1, num_warmup=0, cache_path=str(path))


def _valid(path) -> bool:
    lines = path.read_text().splitlines()
    return (lines[0] == "dmuon-autotune 1" and lines[-1].startswith(f"end\t{len(POINTS)}\t")
            and all(line.startswith("entry\tns_time\t") for line in lines[2:-1]))


def _warnings(stderr: str, path) -> list[str]:
    return [line for line in stderr.splitlines() if "ignoring the autotune cache" in line and str(path) in line]


@pytest.mark.parametrize("corrupt", [
    lambda text: "garbage\nnot a store\n",
    lambda text: text[: text.index("\n", text.index("entry")) - 3] + "\n",  # truncated mid-number
    lambda text: text[: len(text) - 5],                                     # truncated in the end line
    lambda text: text[: text.index("\nend\t") + 1],                         # the end line lost
    lambda text: text.replace("ns_time\t8\t12", "ns_time\t9\t12", 1),      # edited
], ids=["garbage", "truncated-number", "truncated-end-line", "no-end-line", "edited"])
def test_corrupt_store_is_ignored_with_one_warning_and_remeasured(tmp_path, capfd, corrupt):
    first = tmp_path / "first.txt"
    _profile(first)
    path = tmp_path / "costs.txt"
    path.write_text(corrupt(first.read_text()))
    capfd.readouterr()
    table = _profile(path)
    assert len(_warnings(capfd.readouterr().err, path)) == 1
    assert sorted((r, c, n) for r, c, n, _ in table.entries()) == sorted(POINTS)
    assert _valid(path)  # rewritten whole


def test_valid_store_is_read_as_written_without_a_warning(tmp_path, capfd):
    written = tmp_path / "written.txt"
    measured = _profile(written)
    # NOTE: a copy under another path: this process has not read it yet (it keeps a store
    # in memory per path), so its values come from the file.
    copy = tmp_path / "copy.txt"
    shutil.copy(written, copy)
    capfd.readouterr()
    loaded = _profile(copy)
    assert not _warnings(capfd.readouterr().err, copy)
    # NOTE: kept with 9 significant digits (the store's format).
    for (r, c, n, t), (r2, c2, n2, t2) in zip(sorted(loaded.entries()), sorted(measured.entries())):
        assert (r, c, n) == (r2, c2, n2) and t == pytest.approx(t2, rel=1e-8)


_FAKE_RANK_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore
import dmuon

dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
mesh = init_device_mesh("cpu", (2,))
params = [nn.Parameter(distribute_tensor(torch.randn(*s), mesh, [Shard(0)])) for s in [(6, 10)] * 5 + [(10, 4)]]
for p in params:
    # NOTE: this rank's shard made here: distribute_tensor over the fake backend scatters
    # nothing, and the shard it leaves is uninitialized memory (a NaN now and then).
    p.grad = DTensor.from_local(torch.randn(p.to_local().shape), mesh, [Shard(0)], run_check=False, shape=p.shape,
                                stride=p.stride())
opt = dmuon.DMuon([(f"w{i}", p) for i, p in enumerate(params)], lr=0.02, cost_model=sys.argv[1], planner="lpt")
opt.step()
print(sorted(set((r, c, n) for r, c, n, _ in opt.runtime.cost_entries)))
print(any(m == "dmuon.cli" or m.startswith("dmuon.cli.") for m in sys.modules))
"""


@pytest.mark.parametrize("cost_model", ["profile", "analytic"])
def test_the_library_plans_with_the_engines_own_timing(cost_model):
    # A rank of a fake world of 2 on the CPU: its engine times each shape's NS batches (1,
    # 2, 4 and all 5 of 6x10; the one 10x4) and plans with them; the library never imports
    # the CLI's package (dmuon.cli) for it.
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _FAKE_RANK_SCRIPT, cost_model], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    timed, imported = result.stdout.strip().splitlines()[-2:]
    expected = [(6, 10, 1), (6, 10, 2), (6, 10, 4), (6, 10, 5), (10, 4, 1)] if cost_model == "profile" else []
    assert timed == str(expected) and imported == "False", result.stdout


@pytest.mark.slow
def test_concurrent_writers_never_leave_a_torn_file(tmp_path):
    path = tmp_path / "costs.txt"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_profile, args=(str(path),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert _valid(path)
