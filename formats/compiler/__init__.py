"""The compile layer under formats/ and shuffling/: numba JIT with a source-keyed cache, and the ahead-of-time module."""
