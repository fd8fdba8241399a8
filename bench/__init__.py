"""Benchmarks: each module measures one thing side by side and prints a table or writes a result file beside it
(bench/README.md lists them with their commands). Run one from the repository root as a module,
`.venv/bin/python -m bench.NAME --help`; what they share is in bench/common.py, and no bench imports another."""
