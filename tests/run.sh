#!/usr/bin/env bash
# The test command: set up, then run the whole suite on every backend that starts here.
# The header printed by pytest lists which backends ran and why any was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh
exec .venv/bin/python -m pytest "$@"
