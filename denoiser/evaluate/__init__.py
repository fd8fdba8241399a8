"""Judging a model: FID, attention statistics, and the pictures (grids, overlays, charts)."""
