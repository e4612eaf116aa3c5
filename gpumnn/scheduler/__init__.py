"""Pre-inference decisions: scheme selection, placement (hybrid scheduling), memory planning."""
from .cost import CostModel
from .memory import MemoryPlan, plan_memory
from .placement import Placement, Step, place
from .schemes import select_schemes

__all__ = ["CostModel", "MemoryPlan", "plan_memory", "Placement", "Step", "place", "select_schemes"]
