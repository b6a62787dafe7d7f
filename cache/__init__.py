"""Node-local shard cache, sources and prefetch (no torch here)."""
