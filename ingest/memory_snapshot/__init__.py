"""The memory_snapshot format."""
