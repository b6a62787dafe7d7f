"""`shardfeed bench`: throughput, format and shuffle benchmarks, side by side with the peers."""
