"""``python -m spe ARGS`` runs the ``spe`` command."""

import sys

from spe.lab.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
