"""Feeds: what a Loader reads next, one work item at a time (base.py holds the contract)."""
