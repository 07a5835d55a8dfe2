"""The one HTTP boundary for scraping: URL checks, deadlines, size caps, errors that name the fix.

Server /metrics and GPU exporters are all plain GETs of Prometheus text. Failures become
`SourceUnavailable` (not answering, HTTP error, too slow, too large) or `InputError` (a URL
that cannot be right) with the URL's credentials removed, so no secret reaches a message.

Every scrape is bounded in time and size: `timeout` is a TOTAL deadline for the whole
answer (connect, status line, headers and body: `vramdoctor.sources.guarded.Deadline` shuts
the socket down when it passes, so headers or a body that trickle in a byte at a time are cut
off; name resolution and a SOCKS proxy's handshake are under it too), a body over `max_bytes`
(after decompression) is refused without being kept, and a
redirect is never followed (one line naming its target: its body is never read, and no header
goes to another host).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.redact import redact_url
from vramdoctor.sources.guarded import (
    Deadline,
    SocksUnavailable,
    guarded_session,
    is_redirect,
    not_reached,
    redirect_error,
)

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT_S", "Scraper", "metrics_url", "parse_exposition"]

DEFAULT_TIMEOUT_S = 5.0
# A big vLLM/SGLang page with every histogram is well under 2 MiB; 16 MiB is a broken server.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024


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
        raise InputError(
            f"unsupported URL scheme {parts.scheme!r} in {redact_url(url)}: use http or https"
        )
    if not parts.hostname:
        raise InputError(f"no host in URL {redact_url(url)}")
    path = parts.path if parts.path not in ("", "/") else default_path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


class Scraper:
    """GETs one URL repeatedly over a kept-alive session (cheap at 1-10 Hz).

    `timeout` (s) bounds each whole scrape; `max_bytes` bounds each body.
    """

    def __init__(
        self,
        url: str,
        *,
        what: str,
        timeout: float = DEFAULT_TIMEOUT_S,
        headers: dict[str, str] | None = None,
        default_path: str = "/metrics",
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.url = metrics_url(url, default_path)
        # The URL as it may be printed or recorded (credentials removed).
        self.shown_url = redact_url(self.url)
        self.what = what
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._session = guarded_session()
        if headers:
            self._session.headers.update(headers)

    def _too_slow(self, got: int, deadline: Deadline | None = None) -> SourceUnavailable:
        early = (
            not_reached(deadline, self.what, self.shown_url, self.timeout)
            if deadline is not None
            else None
        )
        if early is not None:  # a name not resolved, a SOCKS proxy that did not connect
            return early
        return SourceUnavailable(
            f"{self.what} at {self.shown_url} did not finish its answer within {self.timeout:g} s"
            + (f" ({got} bytes had come)" if got else "")
        )

    def _too_large(self) -> SourceUnavailable:
        return SourceUnavailable(
            f"{self.what} at {self.shown_url} sent more than {self.max_bytes // 2**20} MiB: "
            "not read (a metrics page is far smaller)"
        )

    def get_text(self) -> str:
        with Deadline(self.timeout) as deadline:
            return self._get_text(deadline)

    def _get_text(self, deadline: Deadline) -> str:
        try:
            resp = self._session.get(
                self.url, timeout=(deadline.remaining(), deadline.remaining()), stream=True
            )
        except requests.exceptions.InvalidURL as exc:
            raise InputError(f"not a valid URL: {self.shown_url} ({type(exc).__name__})") from None
        except requests.exceptions.Timeout:
            raise self._too_slow(0, deadline) from None
        except requests.exceptions.ConnectionError as exc:
            if deadline.expired():
                raise self._too_slow(0, deadline) from None
            if deadline.connected:  # it connected, then closed or broke before answering
                raise SourceUnavailable(
                    f"{self.what} at {self.shown_url} connected but closed the connection "
                    f"before its answer ({type(exc).__name__})"
                ) from None
            raise SourceUnavailable(
                f"cannot connect to {self.what} at {self.shown_url}: is it running, and is the port right?"
            ) from None
        except SocksUnavailable as exc:
            raise SourceUnavailable(
                f"{self.what} at {self.shown_url} was not reached: {exc}"
            ) from None
        except requests.exceptions.RequestException as exc:
            raise SourceUnavailable(
                f"{self.what} at {self.shown_url} failed: {type(exc).__name__}"
            ) from None
        with resp:
            if is_redirect(resp):
                raise redirect_error(resp, self.what, self.shown_url)
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
                raise SourceUnavailable(
                    f"{self.what} at {self.shown_url} answered HTTP {resp.status_code}"
                )
            body = self._read_body(resp, deadline)
            encoding = (
                resp.encoding
                if "charset=" in resp.headers.get("content-type", "").lower()
                else None
            )
        # Prometheus text is UTF-8 (requests would guess Latin-1 without a charset).
        try:
            return body.decode(encoding or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know
            return body.decode("utf-8", errors="replace")

    def _read_body(self, resp: requests.Response, deadline: Deadline) -> bytes:
        """The body, read in chunks against the total deadline and the size cap."""
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise self._too_large()
        raw = resp.raw
        conn = getattr(raw, "connection", None)
        sock = getattr(conn, "sock", None)
        chunks: list[bytes] = []
        size = 0
        while True:
            if deadline.expired():
                raise self._too_slow(size)
            if sock is not None:
                try:  # each read waits at most until the deadline, however the bytes trickle
                    sock.settimeout(deadline.remaining())
                except OSError:
                    sock = None
            try:
                data = raw.read1(_CHUNK_BYTES, decode_content=True)
            except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
                raise self._too_slow(size) from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if deadline.expired():  # the deadline's timer cut the socket off
                    raise self._too_slow(size) from None
                raise SourceUnavailable(
                    f"{self.what} at {self.shown_url} broke off its answer ({type(exc).__name__})"
                ) from None
            if not data:  # end of the body (or the deadline's timer shut the socket)
                if deadline.fired:
                    raise self._too_slow(size)
                break
            size += len(data)
            if size > self.max_bytes:
                raise self._too_large()
            chunks.append(data)
        return b"".join(chunks)

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
