"""Sample ranges: the bytes of the samples a plan reads, their room, their cost, and their late fetches."""
