"""What an answer from the manager's URL means (pure): the manager's own word, or weather.

docs/architecture.md, rule 7: one manager serves the whole fleet, usually behind a reverse proxy,
and a proxy answers with its own pages while it reloads, points at a wrong upstream or a WAF rule
fires: an nginx ``404 Not Found`` HTML page, Go's plain ``404 page not found``, an empty 404,
401/403/405/413/429, 502/503 pages, a 200 maintenance page. If such a page ended a machine, one
proxy misstep would end every healthy machine of the fleet within minutes. So only the
manager's own word is final (``docs/manager-api.md``: its errors are JSON
``{"error": "<msg>"}``; a wrong method is a plain-text 405):

- **gone**: a 404 whose body is the manager's JSON error with the text it gives for an unknown
  or killed instance on that endpoint (:data:`GONE_TEXTS`): ``instance not found`` on
  ``/param-done`` and ``/bench-done``, ``instance not found or already killed`` on
  ``/running``. (The other positive evidence, our record in ``GET /status`` in state
  ``killed``, is :func:`cuzk_supervisor.core.reconcile.gone_reason`.)
- **rejected**: a 400 whose body is the manager's JSON error (``label is required``, ``bad
  request: …``): our request is wrong and sending it again cannot help; final, with its reason.
- **answer**: a 2xx (whether its body is the API's answer is the caller's check: a 2xx that is
  not is weather too).
- **weather**: everything else, HTML, plain text, an empty body, a JSON body that is not the
  manager's error, any other 4xx, 3xx, 5xx, 429. Retried under the shared backoff; never final.

The adapter parses the body (JSON is I/O-free but not allowed here) and hands in the manager's
error text, if the body is that; everything here is a function of plain values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum

__all__ = ["GONE_TEXTS", "Meaning", "describe_answer", "first_text_line", "meaning"]

GONE_TEXTS: Mapping[str, str] = {
    "/param-done": "instance not found",
    "/bench-done": "instance not found",
    "/running": "instance not found or already killed",
}
"""The manager's 404 texts for an instance it does not know, or killed (``/running``), per
endpoint (``docs/manager-api.md``); the sim manager answers the same."""


class Meaning(Enum):
    ANSWER = "answer"
    GONE = "gone"
    REJECTED = "rejected"
    WEATHER = "weather"


def meaning(path: str, status: int, manager_error: str | None) -> Meaning:
    """What an answer with ``status`` to ``path`` means; ``manager_error`` is the text of the
    body when the body is the manager's JSON error ``{"error": "<text>"}`` and nothing else
    (None otherwise: HTML, plain text, empty, any other JSON)."""
    if 200 <= status < 300:
        return Meaning.ANSWER
    if manager_error is not None:
        if status == 404 and GONE_TEXTS.get(path) == manager_error.strip():
            return Meaning.GONE
        if status == 400:
            return Meaning.REJECTED
    return Meaning.WEATHER


_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")
FIRST_LINE_CHARS = 100


def first_text_line(text: str, limit: int = FIRST_LINE_CHARS) -> str:
    """The body's first line that has text once HTML tags are taken out (an nginx page's ``<html>``
    line has none: its title does), cut to ``limit`` characters; '' without text."""
    for raw in text.splitlines():
        line = _SPACE.sub(" ", _TAG.sub(" ", raw)).strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def describe_answer(status: int, server: str | None, first_line: str) -> str:
    """Who answered and how, for the warning: ``HTTP 404 from nginx/1.25: "404 Not Found"``,
    ``HTTP 404 (no Server header): "404 page not found"``, ``HTTP 404 (no Server header),
    empty body``."""
    who = f"from {server.strip()[:60]}" if server and server.strip() else "(no Server header)"
    said = f': "{first_line}"' if first_line else ", empty body"
    return f"HTTP {status} {who}{said}"
