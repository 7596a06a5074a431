"""Checks the server makes before it answers: the Host of a tokenless dashboard, a POST's
Origin, and the login cookie's value.

- Without a token (loopback only: the CLI refuses anything else) the Host header must
  name a loopback address, or a page on another site could rebind its DNS name to
  127.0.0.1 and talk to the dashboard as same-origin (DNS rebinding).
- A POST whose Origin is another site's (or ``null``) is refused, beside the CSRF token.
- The login cookie holds an HMAC of the token, never the token itself: a cookie that
  leaks (a proxy's log, a backup of the browser profile) does not give the Bearer token.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def host_name(host_header: str) -> str:
    """The name part of a Host header (``[::1]:8765`` -> ``::1``)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_ok(host_header: str | None) -> bool:
    return host_name(host_header or "") in LOOPBACK_NAMES


def origin_ok(origin: str | None, host_header: str | None) -> bool:
    """True when the POST carries no Origin, or this dashboard's own."""
    if origin is None:
        return True
    if origin.strip().lower() == "null":
        return False
    return urlsplit(origin.strip()).netloc.lower() == (host_header or "").strip().lower()


def session_value(token: str) -> str:
    """The login cookie's value for a token."""
    return hmac.new(token.encode(), b"emqtasks-dashboard-session", hashlib.sha256).hexdigest()
