"""A reader's shards through the cache: the shard-access contract, whole shards and sample ranges."""
