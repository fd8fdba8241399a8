"""`python -m denoiser.cli`: the command line."""

from denoiser.cli.main import main

main()
