"""The command-line generator from a source checkout: the same as `decodescope-generate` (engine/cli.py)."""
import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
