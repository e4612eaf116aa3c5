"""``python -m gpumnn`` is the ``gpumnn`` command."""
import sys

from .cli import main

sys.exit(main())
