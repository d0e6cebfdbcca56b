"""egpu: eBPF probes inside running CUDA kernels (DESIGN.md). The package imports nothing here."""

__version__ = "0.1.0"   # pyproject.toml reads it
