"""`python -m denoiser.cli`: the command line."""

from denoiser.cli.main.main import main

main()
