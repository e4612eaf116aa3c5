"""``python -m gpumnn`` is the ``gpumnn`` command."""
import sys

from .tools.cli import main

sys.exit(main())
