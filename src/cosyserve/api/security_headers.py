"""Headers every answer carries, so that a browser cannot be turned against its user.

- `X-Frame-Options: SAMEORIGIN` and `frame-ancestors 'self'`: no other page may frame the UI (a page on
  another port of the same host framed a signed-in admin's page, and the admin's clicks in it deleted a
  user's voice; inside the frame they were the page's own, so the cross-site check let them through).
- `X-Content-Type-Options: nosniff`: a file is what its type says, never sniffed into a page.
- `Referrer-Policy: same-origin`: a signed download link in a page's address goes to no other site.
- `Cache-Control: private` on answers to a request with credentials (a key or a sign-in), added to what
  the answer set itself (a stream's `no-cache`): one user's audio or voice list is kept by that user's
  browser, never by a shared proxy.
"""

from __future__ import annotations

from collections.abc import Mapping

from cosyserve.service.access.sessions import SESSION_COOKIE

ALWAYS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", b"frame-ancestors 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


def credentialed(headers: Mapping[str, str]) -> bool:
    """Whether a request (its headers, names lower case) carries a key or a sign-in."""
    keyed = bool(headers.get("authorization") or headers.get("x-api-key"))
    return keyed or f"{SESSION_COOKIE}=" in headers.get("cookie", "")


def secured(headers: list[tuple[bytes, bytes]], *, private: bool) -> list[tuple[bytes, bytes]]:
    """`headers` of an answer with the ones above added where the answer did not set them itself."""
    present = {name.lower() for name, _ in headers}
    added = [(name, value) for name, value in ALWAYS if name not in present]
    if private:  # kept (a stream's no-cache), but never by a shared cache
        headers = [
            (name, value + b", private")
            if name.lower() == b"cache-control" and b"private" not in value and b"no-store" not in value
            else (name, value)
            for name, value in headers
        ]
        if b"cache-control" not in present:
            added.append((b"cache-control", b"private"))
    return [*headers, *added]
