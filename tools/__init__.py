"""The `shardfeed` CLI, the reference trainer and benchmarks. Nothing imports this."""
