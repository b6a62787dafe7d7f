"""`shardfeed convert`: other datasets (image folders, JSONL, CSV, Parquet, tars) into shards."""
