"""`python -m denoiser.cli`: the command line, its exit status kept."""

import sys

from denoiser.cli.main import main

sys.exit(main())
