"""dmuon: distributed Muon with a C++/CUDA core.

>>> import dmuon
>>> optimizer = dmuon.DMuon(model, lr=3e-3)   # Muon for matrices, AdamW for the rest
"""

from dmuon import checkpoint, presets
from dmuon.config import Execution, MuonMath, Ownership
from dmuon.optimizer import DMuon, NonFiniteGradientError, TornStateError
from dmuon.ownership import OwnedMatrices, own_matrices
from dmuon.qk_clip import QKClip, QKLayer
from dmuon.rank_agreement import LOCAL
from dmuon.routing import MatrixView, RoutedParam, route_module, route_named, route_params
from dmuon.routing_summary import RoutingSummary

__all__ = ["DMuon", "Execution", "LOCAL", "MatrixView", "MuonMath", "NonFiniteGradientError", "OwnedMatrices",
           "Ownership", "QKClip", "QKLayer", "RoutedParam", "RoutingSummary", "TornStateError", "checkpoint",
           "own_matrices", "presets", "route_module", "route_named", "route_params"]
__version__ = "0.1.0"
