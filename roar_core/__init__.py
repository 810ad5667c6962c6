"""roar: observed lineage for workflow engines."""

__version__ = "0.1.0"
