"""`python -m denoiser.train` and `accelerate launch -m denoiser.train`: the training command, its exit status kept."""

import sys

from denoiser.train.command import main

sys.exit(main())
