"""Pre-inference decisions: scheme selection, placement (hybrid scheduling), pool layout."""
from .cost import CostModel
from .memory import PoolLayout, lay_out_pool
from .placement import Placement, Step, place
from .schemes import select_schemes

__all__ = ["CostModel", "PoolLayout", "lay_out_pool", "Placement", "Step", "place", "select_schemes"]
