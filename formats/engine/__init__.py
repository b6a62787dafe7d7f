"""The batch read engine: many samples at once, few Python objects (gather kernels, open-shard table, columnar rows, decompression)."""
