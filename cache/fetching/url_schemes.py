"""The one URL classifier: a local path or a URL, its scheme, and whether shardfeed reads it.

``is_remote(source)``: read through the node cache (any scheme but a plain
path and ``file://``). ``check_url``: the scheme, or a ShardError naming the
URL for a shell URL (``pipe:``, never run) or a scheme shardfeed has no
reader for. Every part of the project asks here (the dataset, the cache, the
CLI), so a URL is never local to one and remote to another.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from shardfeed.formats import ShardError

# Schemes whose driver ships outside fsspec itself, and the extra that installs it.
EXTRAS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
# The remote schemes read here: others fsspec knows (ftp, sftp, hdfs, ...) are refused up
# front rather than failing (or hanging) inside the node cache later.
REMOTE_SCHEMES = ("http", "https", *EXTRAS)
SUPPORTED = "a local path or a file://, http(s)://, s3://, gs:// or az:// URL"
REFUSED = ("pipe", "shell", "cmd")


def scheme_of(url: str) -> str:
    """'' for a plain path, else the lower-case URL scheme ('s3', 'https', 'file')."""
    if "://" not in url:
        if url.split(":", 1)[0].lower() in REFUSED:
            return url.split(":", 1)[0].lower()  # "pipe:cmd" has no "//" but is still a shell URL
        return ""
    return urlsplit(url).scheme.lower()


def is_remote(source) -> bool:
    """Whether ``source`` is a URL read through the node cache (not a plain path nor ``file://``);
    a shell URL counts as one, so check_url refuses it by name rather than opening it as a path."""
    return scheme_of(str(source)) not in ("", "file")


def check_url(url: str) -> str:
    """``url``'s scheme ('' for a path); ShardError naming the URL and the supported
    schemes for a shell URL or a scheme shardfeed has no reader for."""
    scheme = scheme_of(str(url))
    if scheme in REFUSED:
        raise ShardError(url, f"{scheme}: URLs run shell commands and are refused; give {SUPPORTED}")
    if scheme not in ("", "file", *REMOTE_SCHEMES):
        raise ShardError(url, f"unknown URL scheme {scheme!r}: shardfeed has no reader for it; give "
                              f"{SUPPORTED}")
    return scheme
