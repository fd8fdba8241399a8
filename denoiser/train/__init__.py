"""Training: the typed config, the loop, its batches, EMA, checkpoints and run folders, the launcher and the command."""
