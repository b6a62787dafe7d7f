"""Serving files in byte ranges over HTTP: what the demo's server, the cache
benchmark's throttled server and the tests' fault-injecting server share.

The standard library's http.server answers whole files only, while the cache
fetches shards in ranges; these two helpers are the part every such server
needs: a request path resolved inside the served folder (never outside it),
and the status and headers of a (possibly ranged) answer.
"""

from __future__ import annotations

import os
import re
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def resolve(root: str, request_path: str) -> str | None:
    """The file or folder the request names inside ``root``, or None if it lies outside."""
    root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(root, unquote(urlsplit(request_path).path).lstrip("/")))
    return path if path == root or path.startswith(root + os.sep) else None


def start_range_reply(handler: BaseHTTPRequestHandler, size: int, headers: dict | None = None) -> tuple[int, int]:
    """Send the status and headers answering the request's Range (200 without
    one, 206 with one) for a body of ``size`` bytes; returns the [start, end) to send.
    ``headers`` (an ETag, Last-Modified) are sent too."""
    start, end, status = 0, size, 200
    m = _RANGE.match(handler.headers.get("Range", ""))
    if m:
        start = int(m.group(1))
        end = min(size, int(m.group(2)) + 1) if m.group(2) else size
        status = 206
    handler.send_response(status)
    handler.send_header("Content-Length", str(max(0, end - start)))
    handler.send_header("Accept-Ranges", "bytes")
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    if status == 206:
        handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
    handler.end_headers()
    return start, end
