"""Permutations, epoch plans and shuffle-quality metrics (no torch here)."""
