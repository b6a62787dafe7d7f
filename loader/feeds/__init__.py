"""Feeds: what a Loader reads next, one work item at a time (base.py holds the contract)."""

# how often a follower looks for new commits, and how long it waits for one before raising: here, not in
# stream_log.py, so that ShardDataset's defaults do not import the streaming code (issue #24)
POLL_S = 0.5
IDLE_TIMEOUT_S = 600.0
