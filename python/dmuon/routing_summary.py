"""What DMuon's routing decided, in numbers and names: `DMuon.routing_summary()`, the one log
line at construction and the warning when Muon gets little or none of a model's matrices."""

from __future__ import annotations

import dataclasses
import logging
import warnings

logger = logging.getLogger("dmuon")

# NOTE: below this share of the matrix elements on Muon, a model is mostly trained by AdamW:
# typical LMs put 60–90% of their matrix elements in Muon's matrices (embeddings and head
# are the rest), so less usually means a misrouted model (or a tiny one with a big vocabulary).
MIN_MUON_SHARE = 0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutedEntry:
    name: str
    shape: tuple[int, ...]
    use_muon: bool
    reason: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingSummary:
    """Parameters and elements per side; the matrices (ndim ≥ 2) AdamW takes, with reasons."""

    entries: tuple[RoutedEntry, ...]

    @property
    def muon(self) -> list[RoutedEntry]:
        return [e for e in self.entries if e.use_muon]

    @property
    def adamw(self) -> list[RoutedEntry]:
        return [e for e in self.entries if not e.use_muon]

    @property
    def adamw_matrices(self) -> list[RoutedEntry]:
        return [e for e in self.adamw if len(e.shape) >= 2]

    @property
    def muon_elements(self) -> int:
        return sum(e.numel for e in self.muon)

    @property
    def adamw_elements(self) -> int:
        return sum(e.numel for e in self.adamw)

    @property
    def muon_matrix_share(self) -> float:
        """Muon's share of the elements of all parameters with ndim ≥ 2 (1 when there are none)."""
        total = self.muon_elements + sum(e.numel for e in self.adamw_matrices)
        return self.muon_elements / total if total else 1.0

    def line(self) -> str:
        """One line: counts and elements per side, then the AdamW matrices by name."""
        matrices = ", ".join(f"{e.name} {list(e.shape)} ({e.reason})" for e in self.adamw_matrices[:8])
        more = f" and {len(self.adamw_matrices) - 8} more" if len(self.adamw_matrices) > 8 else ""
        return (f"dmuon routing: Muon {len(self.muon)} parameters ({_count(self.muon_elements)} elements, "
                f"{self.muon_matrix_share:.0%} of the matrix elements), AdamW {len(self.adamw)} parameters "
                f"({_count(self.adamw_elements)} elements); AdamW matrices: {matrices or 'none'}{more}")

    def __str__(self) -> str:
        rows = [self.line(), f"{'parameter':<48} {'shape':<20} {'side':<6} reason"]
        rows += [f"{e.name:<48} {str(list(e.shape)):<20} {'Muon' if e.use_muon else 'AdamW':<6} {e.reason}"
                 for e in self.entries]
        return "\n".join(rows)

    def warning(self) -> str:
        """Why this routing deserves a look ("" when it does not)."""
        if not self.muon and self.adamw_matrices:
            return ("DMuon routes no parameter to Muon: every parameter, matrices included, uses AdamW. "
                    f"{self._adamw_matrices_text()}")
        if self.muon and self.muon_matrix_share < MIN_MUON_SHARE:
            return (f"DMuon routes only {self.muon_matrix_share:.0%} of the matrix elements to Muon. "
                    f"{self._adamw_matrices_text()}")
        return ""

    def _adamw_matrices_text(self) -> str:
        largest = sorted(self.adamw_matrices, key=lambda e: -e.numel)[:5]
        shown = "; ".join(f"{e.name} {list(e.shape)}: {e.reason}" for e in largest)
        return (f"AdamW takes {shown}. If that is not intended, pass muon_filter=(name, param) -> bool with "
                "the model, or param groups with use_muon=True/False (optimizer.routing_summary() lists every "
                "decision).")


def _count(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


def announce(summary: RoutingSummary, is_first_rank: bool) -> None:
    """The construction's log line (logger "dmuon", INFO) and its warning, on the first rank."""
    if not is_first_rank:
        return
    logger.info(summary.line())
    text = summary.warning()
    if text:
        warnings.warn(text, UserWarning, stacklevel=3)  # NOTE: the line constructing DMuon


def entries_of(param_groups: list[dict], name_of, reason_of) -> RoutingSummary:
    """The summary of DMuon's param groups (`reason_of(param, use_muon)`: why it is there)."""
    entries = []
    for group in param_groups:
        for p in group["params"]:
            entries.append(RoutedEntry(name=name_of(p), shape=tuple(p.shape), use_muon=bool(group["use_muon"]),
                                       reason=reason_of(p, bool(group["use_muon"]))))
    return RoutingSummary(entries=tuple(entries))

