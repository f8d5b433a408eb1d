"""The step conventions of other Muon implementations as DMuon options, for switching without
changing what a step does::

    optimizer = dmuon.DMuon(model, **dmuon.presets.torch_muon(lr=0.02))

Each function returns a :class:`dmuon.config.Preset`: ``lr``, ``weight_decay``, a
:class:`dmuon.MuonMath` and the AdamW options, typed, and a mapping of DMuon keyword
arguments (its own keyword defaults are the defaults of the implementation it follows); pass
any other DMuon option (``execution=…``) next to it. Every preset uses the quintic
Newton–Schulz with Keller Jordan's coefficients (3.4445, −4.7750, 2.0315) for 5 steps
(``ns_algorithm="standard"``), EMA momentum 0.95 with Nesterov, and AdamW for the parameters
Muon does not take (DMuon routes them; those implementations leave the split to the user).

What differs from the implementation followed, and by how much, is tested step for step
(tests/python/test_presets.py): they iterate Newton–Schulz in bfloat16, DMuon in float32 on
the CPU (bfloat16 for standard NS on a GPU), and they divide by ‖X‖ + 1e-7 where DMuon
divides by max(‖X‖, 1e-7). Moonlight's SGD-style momentum (B ← μ·B + G) is DMuon's EMA
momentum times 1/(1−μ): the same direction, hence the same orthogonalized update.
"""

from __future__ import annotations

from dmuon.config import MuonMath, Preset

_QUINTIC = ((3.4445, -4.7750, 2.0315),)


def _standard_ns(momentum: float, nesterov: bool, adjust_lr: str | None) -> MuonMath:
    return MuonMath(momentum=momentum, nesterov=nesterov, ns_algorithm="standard", ns_coefficients=_QUINTIC,
                    ns_steps=5, eps=1e-7, adjust_lr=adjust_lr)


def torch_muon(*, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
               adjust_lr_fn: str | None = None, adamw_lr: float | None = None,
               adamw_betas: tuple[float, float] = (0.9, 0.999), adamw_eps: float = 1e-8,
               adamw_weight_decay: float = 0.01) -> Preset:
    """torch.optim.Muon (torch 2.9+): lr 1e-3, weight decay 0.1, ``adjust_lr_fn`` None or
    "original" (√max(1, rows/cols)) or "match_rms_adamw" (0.2·√max(rows, cols)). The AdamW
    options default to torch.optim.AdamW's (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
    decay 0.01), the optimizer torch.optim.Muon's docs pair it with; ``adamw_lr`` None: ``lr``."""
    if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
        raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw' (as torch.optim.Muon), "
                         f"got {adjust_lr_fn!r}")
    return Preset(lr=lr, weight_decay=weight_decay,
                  math=_standard_ns(momentum, nesterov, "original" if adjust_lr_fn is None else adjust_lr_fn),
                  adamw_lr=adamw_lr, adamw_betas=adamw_betas, adamw_eps=adamw_eps,
                  adamw_weight_decay=adamw_weight_decay)


def moonlight(*, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
              adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8) -> Preset:
    """Moonlight / Kimi ("Muon is Scalable for LLM Training", Liu et al. 2025): the update
    scaled by 0.2·√max(rows, cols) so that its RMS matches AdamW's, which lets Muon reuse
    AdamW's lr and weight decay; AdamW (betas (0.9, 0.95), eps 1e-8) with the same lr and
    weight decay. NOTE: Moonlight's AdamW puts eps outside the bias correction
    (m/(eps + √v)·√(1−β2ᵗ)/(1−β1ᵗ)), torch's inside (m̂/(√v̂ + eps)): equal up to eps."""
    return Preset(lr=lr, weight_decay=weight_decay, math=_standard_ns(momentum, nesterov, "match_rms_adamw"),
                  adamw_lr=lr, adamw_betas=adamw_betas, adamw_eps=adamw_eps, adamw_weight_decay=weight_decay)


def keller_jordan(*, lr: float = 0.02, weight_decay: float = 0.0, momentum: float = 0.95,
                  adamw_lr: float = 3e-4, adamw_betas: tuple[float, float] = (0.9, 0.95),
                  adamw_eps: float = 1e-10, adamw_weight_decay: float = 0.0) -> Preset:
    """Keller Jordan's Muon (KellerJordan/Muon, SingleDeviceMuonWithAuxAdam): lr 0.02, no
    weight decay, the update scaled by √max(1, rows/cols), Nesterov always; its auxiliary
    Adam: lr 3e-4, betas (0.9, 0.95), eps 1e-10, no weight decay. NOTE: for a 4-D
    convolution weight it scales by the kernel's two dims (√max(1, kh/kw)); DMuon uses the
    flattened matrix (out, in·kh·kw)."""
    return Preset(lr=lr, weight_decay=weight_decay, math=_standard_ns(momentum, True, "original"),
                  adamw_lr=adamw_lr, adamw_betas=adamw_betas, adamw_eps=adamw_eps,
                  adamw_weight_decay=adamw_weight_decay)


PRESETS = {"torch_muon": torch_muon, "moonlight": moonlight, "keller_jordan": keller_jordan}
