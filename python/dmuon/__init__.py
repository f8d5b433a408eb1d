"""dmuon: distributed Muon with a C++/CUDA core.

>>> import dmuon
>>> optimizer = dmuon.DMuon(model, lr=3e-3)   # Muon for matrices, AdamW for the rest
"""

from dmuon.optimizer import DMuon, NonFiniteGradientError
from dmuon.ownership import OwnedMatrices, own_matrices
from dmuon.routing import RoutedParam, route_module, route_params

__all__ = ["DMuon", "NonFiniteGradientError", "OwnedMatrices", "own_matrices", "RoutedParam", "route_module", "route_params"]
__version__ = "0.1.0"
