"""Pre-inference decisions: scheme selection, placement (hybrid scheduling), concatenations
written in place, pool layout."""
from .concat import write_concats_in_place
from .cost import CostModel
from .memory import PoolLayout, lay_out_pool
from .placement import Placement, Step, place
from .schemes import select_schemes

__all__ = ["CostModel", "PoolLayout", "lay_out_pool", "Placement", "Step", "place", "select_schemes",
           "write_concats_in_place"]
