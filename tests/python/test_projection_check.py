"""lab/reports/projection_check.py pairs fake-world records with the measured ones of the
same call and reports each figure's error; a record without its counterpart is named."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "reports" / "projection_check.py"
_spec = importlib.util.spec_from_file_location("projection_check", SCRIPT)
projection_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(projection_check)


def _write(path, record):
    path.write_text(json.dumps(record))


def test_pairs_step_and_e2e_records_and_names_the_missing(tmp_path, capsys):
    _write(tmp_path / "step_tiny.json", {"worlds": {"2": {"slowest_rank": {
        "owner": {"step_s": 0.010}, "gather": {"step_s": 0.020}, "adamw": {"step_s": 0.004}}}}})
    _write(tmp_path / "fake_step_tiny_w2.json", {"methods": {
        "owner": {"projected_step_ms": 11.0}, "gather": {"projected_step_ms": 18.0}}})
    _write(tmp_path / "fake_step_tiny_w4.json", {"methods": {"owner": {"projected_step_ms": 6.0}}})
    _write(tmp_path / "e2e_tiny.json", {"config": {"world": 2}, "slowest_rank": {
        "dmuon": {"step_s": 0.100}, "adamw": {"step_s": 0.095}}})
    _write(tmp_path / "fake_e2e_tiny_w2.json", {"optimizers": {
        "dmuon": {"projected_step_ms": 105.0}, "adamw": {"projected_step_ms": 95.0}}})
    found, missing = projection_check.rows(tmp_path)
    assert ("step", "tiny", 2, "owner", 11.0, 10.0) in found
    assert ("step", "tiny", 2, "gather", 18.0, 20.0) in found
    assert ("e2e", "tiny", 2, "dmuon", 105.0, 100.0) in found
    assert len(found) == 4
    assert missing == ["step_tiny.json at world 4"]
    assert projection_check.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "+10.0%" in out and "-10.0%" in out and "+5.0%" in out


def test_unreadable_records_are_named_not_fatal(tmp_path, capsys):
    (tmp_path / "fake_step_tiny_w2.json").write_text("{not json")
    found, missing = projection_check.rows(tmp_path)
    assert found == [] and missing == ["fake_step_tiny_w2.json"]
    assert projection_check.main([str(tmp_path / "absent")]) == 2
