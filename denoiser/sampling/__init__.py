"""Sampling: a request, its plan (resolve), the loop, guidance, prompt weights and prompt-to-prompt."""
