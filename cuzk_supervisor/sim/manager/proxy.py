"""What a reverse proxy in front of the manager answers by itself, for the simulated manager's
fault switches (``faults``): its HTML error pages, a maintenance page, bad 200 bodies, the
``Retry-After`` of a throttled answer, and the **proxy pages** of issue 31 (``PROXY_PAGES``), the
answers of a proxy that reloads, points at a wrong upstream or trips a WAF rule
(``--proxy-rate``, ``--proxy-next``, ``--proxy-page``; docs/sim-manager.md): nginx's HTML pages
(``Server: nginx/1.25.3``), Go's plain-text ``404 page not found``, an empty 404, an API
gateway's JSON 404 and a reset connection.

None of them is the manager's word: the real manager's 404 is JSON
``{"error": "instance not found"}`` (docs/manager-api.md).
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import struct
from email.utils import formatdate

__all__ = [
    "BAD_BODY_KINDS",
    "MAINTENANCE_PAGE",
    "PROXY_PAGES",
    "PROXY_SERVER",
    "RESET",
    "bad_body",
    "check_proxy_page",
    "proxy_error_page",
    "proxy_page",
    "reset_on_close",
    "retry_after_value",
]

PROXY_SERVER = "nginx/1.25.3"
RESET = "reset"
PROXY_PAGES = ("html404", "go404", "empty404", "json404", "html400", "html401", "html403",
               "html405", "html413", "html429", "html502", "html503", RESET)  # fmt: skip
"""The named proxy pages (any ``html<status>`` from 400 to 599 is one too)."""
# What a bad 200 body can be: a proxy's HTML page, nothing, JSON cut short, a JSON object
# without the expected fields, a plain-text "OK".
BAD_BODY_KINDS = ("html", "empty", "truncated", "wrong_json", "plain")

_HTML_TITLES = {
    400: "400 Bad Request",
    401: "401 Authorization Required",
    403: "403 Forbidden",
    404: "404 Not Found",
    405: "405 Not Allowed",
    413: "413 Request Entity Too Large",
    429: "429 Too Many Requests",
    500: "500 Internal Server Error",
    502: "502 Bad Gateway",
    503: "503 Service Temporarily Unavailable",
    504: "504 Gateway Time-out",
}
MAINTENANCE_PAGE = (
    "<!DOCTYPE html>\n<html>\n<head><title>Down for maintenance</title></head>\n<body>\n"
    "<h1>Down for maintenance</h1>\n<p>We&rsquo;ll be back shortly.</p>\n</body>\n</html>\n"
)
_HTML_PAGE = re.compile(r"html([45]\d\d)")


def proxy_error_page(status: int) -> str:
    """The HTML a reverse proxy (nginx) answers with for ``status``."""
    title = _HTML_TITLES.get(status, f"{status} Error")
    return (
        f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n"
        f"<center><h1>{title}</h1></center>\r\n<hr><center>nginx</center>\r\n"
        "</body>\r\n</html>\r\n"
    )


def check_proxy_page(kind: str) -> str:
    """``kind`` when it names a proxy page; ValueError otherwise."""
    if kind in PROXY_PAGES or _HTML_PAGE.fullmatch(kind):
        return kind
    raise ValueError(f"unknown proxy page {kind!r}: html<status>, go404, empty404, json404, reset")


def proxy_page(kind: str) -> tuple[int, bytes, str | None, dict[str, str]]:
    """Status, body, Content-Type and headers of the proxy page ``kind`` (not ``reset``)."""
    html = _HTML_PAGE.fullmatch(kind)
    if html is not None:
        status = int(html.group(1))
        return status, proxy_error_page(status).encode(), "text/html", {"Server": PROXY_SERVER}
    if kind == "go404":
        headers = {"X-Content-Type-Options": "nosniff"}
        return 404, b"404 page not found\n", "text/plain; charset=utf-8", headers
    if kind == "empty404":
        return 404, b"", None, {"Server": PROXY_SERVER}
    if kind == "json404":
        body = b'{"message":"no Route matched with those values"}'
        return 404, body, "application/json; charset=utf-8", {"Server": "kong/3.6.1"}
    raise ValueError(f"no page for {kind!r}")


def bad_body(kind: str) -> tuple[bytes, str]:
    """A 200's body that is not the expected JSON, and its Content-Type."""
    if kind == "html":
        return proxy_error_page(502).encode(), "text/html"
    if kind == "empty":
        return b"", "application/json"
    if kind == "truncated":
        return b'{"ok":tr', "application/json"
    if kind == "wrong_json":
        return b'{"status":"ok","message":"accepted"}\n', "application/json"
    if kind == "plain":
        return b"OK\n", "text/plain; charset=utf-8"
    raise ValueError(f"bad_body_kinds: unknown kind {kind!r}")


def retry_after_value(form: str, seconds: float, now: float) -> str | None:
    """The ``Retry-After`` header of a throttled answer given at ``now`` (unix seconds): whole
    seconds (rounded up), an HTTP-date no earlier than ``now + seconds``, or None (no header)."""
    if form == "none":
        return None
    if form == "date":
        return formatdate(math.ceil(now + seconds), usegmt=True)
    return str(math.ceil(seconds))


def reset_on_close(sock: socket.socket) -> None:
    """Make closing ``sock`` reset the connection (RST, SO_LINGER 0), as a proxy's reset."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
