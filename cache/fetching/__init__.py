"""Fetching from sources: the URL-scheme sources, the HTTP client, and the ranged download with retries."""
