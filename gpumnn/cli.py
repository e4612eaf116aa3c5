"""The ``gpumnn`` command's module before it moved to :mod:`gpumnn.tools.cli`: console scripts
installed before the move import ``gpumnn.cli:main``."""
from .tools.cli import main

__all__ = ["main"]
