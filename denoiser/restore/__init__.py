"""Restoring a person's picture: the request's plan, the chains (denoise, edit, inpaint) and the tiles."""
