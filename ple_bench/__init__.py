"""ple_bench: benchmarking and profiling of PLE / n-gram embedding storage."""

__version__ = "0.1.0"
