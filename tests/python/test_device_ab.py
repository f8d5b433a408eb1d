"""lab/device/device_ab.sh: each side runs with its own files, and the working tree comes back.

The script runs in a scratch git repository (its own copy under lab/device/) with a build
command that does nothing (AB_BUILD=true), so no GPU and no build are needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "device" / "device_ab.sh"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed tree (kept.txt, gone.txt), then a change: kept.txt edited, gone.txt
    deleted, added.txt new."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    (repo / "lab" / "device").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "lab" / "device" / "device_ab.sh")
    (repo / ".gitignore").write_text("/.ab/\n")
    (repo / "kept.txt").write_text("old\n")
    (repo / "gone.txt").write_text("here\n")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    (repo / "kept.txt").write_text("new\n")
    (repo / "gone.txt").unlink()
    (repo / "added.txt").write_text("added\n")
    return repo


def ab(repo: Path, *args: str, out: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, AB_BUILD="true", OUT=str(out or repo / "out"))
    return subprocess.run(["bash", "lab/device/device_ab.sh", *args], cwd=repo, env=env, capture_output=True, text=True)


SHOW = ["--", "bash", "-c", "cat kept.txt; ls gone.txt added.txt 2>/dev/null; true"]


def test_each_side_sees_its_own_files_and_the_tree_comes_back(repo: Path):
    prepared = ab(repo, "prepare")
    assert prepared.returncode == 0, prepared.stderr
    assert sorted((repo / ".ab" / "files").read_text().split("\n")[:-1]) == [
        "absent added.txt", "present gone.txt", "present kept.txt"]
    ran = ab(repo, "run", "--rounds", "2", *SHOW)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = repo / "out"
    for r in (1, 2):
        assert (out / f"ab_base_{r}.txt").read_text().split() == ["old", "gone.txt"]
        assert (out / f"ab_new_{r}.txt").read_text().split() == ["new", "added.txt"]
    # The working tree is the change again.
    assert (repo / "kept.txt").read_text() == "new\n"
    assert (repo / "added.txt").read_text() == "added\n"
    assert not (repo / "gone.txt").exists()


def test_a_failed_build_stops_the_run_and_the_tree_comes_back(repo: Path):
    assert ab(repo, "prepare").returncode == 0
    env = dict(os.environ, AB_BUILD="false", OUT=str(repo / "out"))
    ran = subprocess.run(["bash", "lab/device/device_ab.sh", "run", *SHOW], cwd=repo, env=env,
                         capture_output=True, text=True)
    assert ran.returncode == 1
    assert "the base build failed" in ran.stdout
    assert (repo / "kept.txt").read_text() == "new\n" and not (repo / "gone.txt").exists()


def test_bad_use_is_refused_with_a_reason(repo: Path):
    missing = ab(repo, "run", *SHOW)
    assert missing.returncode == 2 and "run 'prepare' first" in missing.stderr
    assert ab(repo, "prepare", "no-such-rev").returncode == 2
    assert ab(repo, "prepare").returncode == 0
    rounds = ab(repo, "run", "--rounds", "x", *SHOW)
    assert rounds.returncode == 2 and "--rounds must be a positive integer" in rounds.stderr
    assert ab(repo, "run").returncode == 2  # no command
    git(repo, "stash", "-q", "--include-untracked")
    unchanged = ab(repo, "prepare")
    assert unchanged.returncode == 2 and "does not differ" in unchanged.stderr
