"""Benchmarks: same-run ratios, JSON results."""
