"""Checks the server makes before it answers: the Host of a tokenless dashboard, a POST's
Origin and declared length, the login session and its CSRF token, where a redirect may go.

- Without a token (loopback only: the CLI refuses anything else) the Host header must
  name a loopback address, or a page on another site could rebind its DNS name to
  127.0.0.1 and talk to the dashboard as same-origin (DNS rebinding).
- A POST whose Origin is another site's (or ``null``) is refused, beside the CSRF token.
- A sign-in is a session: the cookie holds a random id and its HMAC under a key derived
  from the token, never the token itself (a cookie that leaks, in a proxy's log or a
  backup of the browser profile, does not give the Bearer token), and the session's CSRF
  token is another HMAC of its id: no page before sign-in carries one, and one session's
  token is worth nothing in another. Every process with the token knows the key, and a
  new token ends every session.
- A redirect target taken from a request goes only to a path of this dashboard.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from email.message import Message
from http import HTTPStatus
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: The largest request body read: a form of the dashboard is a few hundred bytes, a
#: selection of 500 dead jobs about 20 KB.
MAX_BODY = 64 * 1024
_DIGITS = re.compile(r"[0-9]+")


class Refused(Exception):
    """A request answered with ``status`` and a message, not served."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


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


def body_size(headers: Message) -> int:
    """The size a POST declares for its body, checked before a byte of it is read: one
    decimal Content-Length (400 otherwise; 411 for a chunked body) of at most MAX_BODY
    (413)."""
    if "Transfer-Encoding" in headers:
        raise Refused(HTTPStatus.LENGTH_REQUIRED, "a request body needs a Content-Length")
    lengths = {v.strip() for v in headers.get_all("Content-Length") or ()}
    if not lengths:
        return 0
    length = lengths.pop()
    if lengths or not _DIGITS.fullmatch(length):
        raise Refused(HTTPStatus.BAD_REQUEST, "malformed Content-Length")
    if len(length) > len(str(MAX_BODY)) or int(length) > MAX_BODY:
        raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                      f"request body over {MAX_BODY // 1024} KB")
    return int(length)


def session_key(token: str) -> bytes:
    """The key that signs the sessions of a token and their CSRF tokens."""
    return hmac.new(token.encode(), b"emqtasks-dashboard-session", hashlib.sha256).digest()


def new_session(key: bytes, name: str = "") -> str:
    """A login cookie's value: a new session's id and its signature; the id starts with the
    signed-in account's ``name`` (``name~random``), so the session says who acts."""
    sid = f"{name}~{secrets.token_urlsafe(18)}" if name else secrets.token_urlsafe(18)
    return f"{sid}.{_sign(key, 'session', sid)}"


def session_id(key: bytes, cookie_value: str) -> str | None:
    """The id of the session a login cookie's value names, if its signature is right."""
    sid, _, mac = cookie_value.partition(".")
    if not sid or not hmac.compare_digest(mac.encode(), _sign(key, "session", sid).encode()):
        return None
    return sid


def csrf_token(key: bytes, sid: str) -> str:
    """The CSRF token of a session ("" for the one session of a tokenless dashboard)."""
    return _sign(key, "csrf", sid)


def _sign(key: bytes, purpose: str, value: str) -> str:
    return hmac.new(key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()


#: %00-%1F and %7F: a control character a later decoding would let into a header.
_ENCODED_CONTROL = re.compile(r"%(?:[01][0-9a-f]|7f)", re.IGNORECASE)


def local_path(target: str | None) -> str:
    """``target`` when it is a path of this dashboard, else the dashboard's root ``/``.

    Only printable ASCII that starts with one ``/``: a browser reads ``//host`` and
    ``/\\host`` as another host, a scheme or host leaves the dashboard, and a control
    character (raw, or percent-encoded for a later decoding) could split the Location
    header. A backslash anywhere is refused (browsers read it as ``/``)."""
    if (not target or target[0] != "/" or target[1:2] == "/" or "\\" in target
            or not all(" " < c < "\x7f" for c in target)
            or _ENCODED_CONTROL.search(target)):
        return "/"
    parts = urlsplit(target)
    return "/" if parts.scheme or parts.netloc else target
