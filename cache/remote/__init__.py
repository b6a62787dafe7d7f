"""Remote datasets: the index mirrored into the cache folder and the commit log followed into it."""
