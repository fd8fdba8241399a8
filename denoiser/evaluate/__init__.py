"""Judging a model: FID and attention statistics (the pictures they draw come from denoiser.pictures)."""
