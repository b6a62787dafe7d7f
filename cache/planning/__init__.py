"""What a plan asks of the cache: prefetch in plan order and the simulation of the bytes it fetches."""
