"""Named DMuon option sets that `bench ns --variants` times against the default in the same
run: name → the DMuon keywords (group options) that differ from the default."""

from __future__ import annotations

from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    # NorMuon (Li et al., 2025): one row second moment per matrix, rows normalized after NS.
    "normuon": {"normuon": True},
}


def variant_options(names: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(name, options) of each requested variant; an unknown name is an error naming it."""
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")
    return [(n, dict(VARIANTS[n])) for n in names]
