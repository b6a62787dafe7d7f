"""The node-local store: the shard cache, its byte budget, admission, disk blocks, locks and eviction."""
