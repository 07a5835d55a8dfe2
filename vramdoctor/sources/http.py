"""The one HTTP boundary for scraping: URL checks, timeouts, errors that name the fix.

Server /metrics and GPU exporters are all plain GETs of Prometheus text. Failures become
`SourceUnavailable` (not answering, HTTP error) or `InputError` (a URL that cannot be
right) with the URL's credentials removed, so no secret reaches a message.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from ..errors import InputError, SourceUnavailable
from ..redact import redact_url

DEFAULT_TIMEOUT_S = 5.0


def metrics_url(url: str, default_path: str = "/metrics") -> str:
    """Normalise a user-given endpoint: add http:// and /metrics where they are missing.

    `localhost:9400` -> `http://localhost:9400/metrics`; a URL with a path is kept as given.
    """
    text = url.strip()
    if not text:
        raise InputError("empty URL")
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise InputError(f"not a valid URL: {redact_url(url)} ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise InputError(f"unsupported URL scheme {parts.scheme!r} in {redact_url(url)}: use http or https")
    if not parts.hostname:
        raise InputError(f"no host in URL {redact_url(url)}")
    path = parts.path if parts.path not in ("", "/") else default_path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


class Scraper:
    """GETs one URL repeatedly over a kept-alive session (cheap at 1-10 Hz)."""

    def __init__(
        self,
        url: str,
        *,
        what: str,
        timeout: float = DEFAULT_TIMEOUT_S,
        headers: dict[str, str] | None = None,
        default_path: str = "/metrics",
    ) -> None:
        self.url = metrics_url(url, default_path)
        # The URL as it may be printed or recorded (credentials removed).
        self.shown_url = redact_url(self.url)
        self.what = what
        self.timeout = timeout
        self._session = requests.Session()
        if headers:
            self._session.headers.update(headers)

    def get_text(self) -> str:
        try:
            resp = self._session.get(self.url, timeout=self.timeout)
        except requests.exceptions.InvalidURL as exc:
            raise InputError(f"not a valid URL: {self.shown_url} ({type(exc).__name__})") from None
        except requests.exceptions.Timeout:
            raise SourceUnavailable(
                f"{self.what} at {self.shown_url} did not answer within {self.timeout:g} s"
            ) from None
        except requests.exceptions.ConnectionError:
            raise SourceUnavailable(
                f"cannot connect to {self.what} at {self.shown_url}: is it running, and is the port right?"
            ) from None
        except requests.exceptions.RequestException as exc:
            raise SourceUnavailable(
                f"{self.what} at {self.shown_url} failed: {type(exc).__name__}"
            ) from None
        if resp.status_code == 404:
            raise SourceUnavailable(
                f"{self.what} at {self.shown_url} answered 404: wrong path, or metrics not enabled"
                + (" (SGLang needs --enable-metrics)" if self.what.startswith("server") else "")
            )
        if resp.status_code in (401, 403):
            raise SourceUnavailable(
                f"{self.what} at {self.shown_url} refused access (HTTP {resp.status_code}): pass the API key"
            )
        if resp.status_code >= 400:
            raise SourceUnavailable(f"{self.what} at {self.shown_url} answered HTTP {resp.status_code}")
        if "charset=" not in resp.headers.get("content-type", "").lower():
            resp.encoding = "utf-8"  # Prometheus text is UTF-8; requests would guess Latin-1
        return resp.text

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_exposition(text: str, *, what: str, shown_url: str) -> list[Any]:
    """Parse Prometheus text with prometheus_client's parser; a non-metrics page is one error."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        head = text.lstrip()[:40].replace("\n", " ")
        raise SourceUnavailable(
            f"{what} at {shown_url} did not return Prometheus metrics "
            f"(starts with {head!r}; parser: {str(exc)[:80]})"
        ) from None
