"""`python -m denoiser.train` and `accelerate launch -m denoiser.train`: the training command."""

from denoiser.train.command.command import main

main()
