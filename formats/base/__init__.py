"""The base under formats/ and shuffling/: helpers that know no format.

Lazy package exports and the start-up GC pause (lazy.py), slot records
(records.py), byte sizes for humans (byte_sizes.py).
"""
