"""`python -m qwen3model`: the command line (see `qwen3model.cli`)."""

import sys

from qwen3model.cli import main

sys.exit(main())
