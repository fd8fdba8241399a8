"""The `denoiser` command line: one module per group of subcommands."""
