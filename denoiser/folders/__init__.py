"""Model folders: loading one, the diffusers pipeline built on it, and the registration with diffusers."""
