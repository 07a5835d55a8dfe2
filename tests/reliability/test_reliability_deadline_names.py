"""The total deadline holds where it used to leak: name resolution and SOCKS proxies.

Before, `guarded.Deadline` covered connect + status line + headers + body for direct
connections and HTTP(S) proxies only. `getaddrinfo` ran outside it (a resolver that hangs held
the call for as long as the resolver liked), and through a SOCKS proxy only the per-read
timeout applied (a proxy that trickles its handshake, or whose server trickles its headers,
held the call for good). Each test here hangs, or says the wrong thing, on that code.

Real sockets throughout: the SOCKS5 proxy is a real one on loopback
(tests/reliability/socks_proxy.py), the HTTP servers are tests/reliability/r3_servers.py's.
A hanging name server is `socket.getaddrinfo` made to block for names under `.hung.test`
(the stdlib is patched, never vramdoctor); everything else resolves as usual. Each call that
could hang runs on a daemon thread with a bound (`bounded`), so a regression fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from r3_servers import RawServer, answer, trickle_headers
from socks_proxy import SocksProxy
from support.cli import vd

from vramdoctor.errors import SourceUnavailable
from vramdoctor.sources import guarded
from vramdoctor.sources.http import Scraper
from vramdoctor.sources.prometheus import PrometheusClient

HUNG = ".hung.test"
METRICS = b"# TYPE up gauge\nup 1\n"
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def bounded(fn: Callable[[], Any], limit_s: float) -> tuple[Any, BaseException | None, float]:
    """fn() on a daemon thread: (its result, what it raised, seconds taken); fails when it
    outlives limit_s."""
    got: list[Any] = [None, None]

    def run() -> None:
        try:
            got[0] = fn()
        except BaseException as exc:  # handed to the test
            got[1] = exc

    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    took = time.monotonic() - t0
    assert not thread.is_alive(), f"still waiting after {limit_s} s: the deadline is not total"
    return got[0], got[1], took


def scrape(url: str, timeout: float) -> Callable[[], str]:
    def call() -> str:
        with Scraper(url, what="server /metrics", timeout=timeout) as s:
            return s.get_text()

    return call


def query(url: str, deadline_s: float) -> Callable[[], Any]:
    def call() -> Any:
        with PrometheusClient(url, deadline_s=deadline_s) as client:
            return client.label_values("__name__")

    return call


def resolver_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "vramdoctor-resolve"]


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy but the one a test sets (and no no_proxy that would bypass it)."""
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def hung_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """`socket.getaddrinfo` blocks for every name under .hung.test until the test ends (then
    the "resolver" gives up with EAI_AGAIN); yields the names asked for, in order."""
    for thread in resolver_threads():  # a slow lookup of an earlier test in this process
        thread.join(15)
    real = socket.getaddrinfo
    release = threading.Event()
    asked: list[str] = []

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(HUNG):
            asked.append(host)
            release.wait(60)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield asked
    release.set()
    for thread in resolver_threads():
        thread.join(5)


# --- name resolution ------------------------------------------------------------------------


def test_a_hung_resolver_costs_the_scraper_its_deadline_and_one_clear_line(
    hung_resolver: list[str],
) -> None:
    _, exc, took = bounded(scrape(f"http://metrics{HUNG}:9", 1.0), 15)
    assert isinstance(exc, SourceUnavailable), exc
    assert str(exc) == (
        f"server /metrics at http://metrics{HUNG}:9/metrics was not reached: the name "
        f"metrics{HUNG} was not resolved within 1 s (the name server did not answer)"
    )
    assert 0.9 < took < 3, took
    assert hung_resolver == [f"metrics{HUNG}"]


def test_a_hung_resolver_costs_a_prometheus_query_its_deadline(hung_resolver: list[str]) -> None:
    _, exc, took = bounded(query(f"http://prom{HUNG}:9090", 1.0), 15)
    assert isinstance(exc, SourceUnavailable), exc
    assert f"the name prom{HUNG} was not resolved within 1 s" in str(exc), exc
    assert str(exc).endswith("(--query-timeout)"), exc
    assert "\n" not in str(exc) and took < 3, took


def test_an_http_proxy_whose_name_hangs_is_under_the_deadline(
    hung_resolver: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with RawServer(answer(200, METRICS, "text/plain")) as srv:
        monkeypatch.setenv("http_proxy", f"http://proxy{HUNG}:3128")
        _, exc, took = bounded(scrape(srv.url, 1.0), 15)
    assert isinstance(exc, SourceUnavailable), exc
    assert f"the name proxy{HUNG} was not resolved within 1 s" in str(exc), exc
    assert took < 3, took
    assert srv.heads == [], "the request went around the proxy"


def test_a_hung_name_is_looked_up_once_however_often_it_is_asked(
    hung_resolver: list[str],
) -> None:
    """A watch scraping a name that hangs every second must not pile up lookup threads."""
    for _ in range(4):
        _, exc, took = bounded(scrape(f"http://again{HUNG}:9", 0.3), 10)
        assert isinstance(exc, SourceUnavailable) and "was not resolved" in str(exc), exc
        assert took < 2, took
    assert hung_resolver == [f"again{HUNG}"], "each call started a lookup of its own"
    assert len(resolver_threads()) == 1
    # a name that resolves is answered meanwhile, and its lookup leaves no thread behind
    with RawServer(answer(200, METRICS, "text/plain")) as srv:
        text, exc, _ = bounded(scrape(f"http://localhost:{srv.port}", 5.0), 15)
    assert exc is None and text == METRICS.decode(), exc
    assert len(resolver_threads()) == 1


def test_lookups_that_wait_at_once_are_bounded(hung_resolver: list[str]) -> None:
    bound = getattr(guarded, "MAX_LOOKUPS", 16)
    names = [f"n{i}{HUNG}" for i in range(bound)]
    for name in names:
        bounded(scrape(f"http://{name}:9", 0.05), 10)
    assert len(resolver_threads()) == bound
    _, exc, took = bounded(scrape(f"http://one-more{HUNG}:9", 5.0), 10)
    assert isinstance(exc, SourceUnavailable) and "was not resolved" in str(exc), exc
    assert took < 1, "a lookup past the bound waited for its deadline instead of being refused"
    assert len(resolver_threads()) == bound
    assert f"one-more{HUNG}" not in hung_resolver


# --- SOCKS proxies --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["trickle", "silent"])
def test_a_socks_proxy_that_stalls_its_handshake_is_cut_off_at_the_deadline(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SocksProxy(mode, every_s=0.2) as proxy:
        monkeypatch.setenv("all_proxy", proxy.url())
        _, exc, took = bounded(scrape("http://127.0.0.1:9", 1.5), 20)
    assert isinstance(exc, SourceUnavailable), exc
    assert str(exc) == (
        "server /metrics at http://127.0.0.1:9/metrics was not reached: the SOCKS proxy "
        f"127.0.0.1:{proxy.port} did not connect it within 1.5 s"
    )
    assert 1.4 < took < 4, took


def test_headers_trickling_through_a_socks_proxy_are_cut_off_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SocksProxy("headers", every_s=0.2) as proxy:
        monkeypatch.setenv("all_proxy", proxy.url())
        _, exc, took = bounded(scrape("http://127.0.0.1:9", 1.5), 20)
    assert isinstance(exc, SourceUnavailable), exc
    assert "did not finish its answer within 1.5 s" in str(exc), exc
    assert "is it running" not in str(exc) and "SOCKS" not in str(exc), exc
    assert took < 4, took


def test_a_prometheus_query_through_a_trickling_socks_proxy_ends_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SocksProxy("trickle", every_s=0.2) as proxy:
        monkeypatch.setenv("all_proxy", proxy.url())
        _, exc, took = bounded(query("http://127.0.0.1:9", 1.5), 20)
    assert isinstance(exc, SourceUnavailable), exc
    assert f"the SOCKS proxy 127.0.0.1:{proxy.port} did not connect it within 1.5 s" in str(exc)
    assert took < 4, took


def test_a_socks5_proxy_with_a_name_that_hangs_here_is_under_the_deadline(
    hung_resolver: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """socks5:// resolves the server's name on this side: before, PySocks did it unbounded.
    The same working proxy answers for names that resolve (socks5h:// sends the name to the
    proxy, socks5:// the address found here)."""
    with RawServer(answer(200, METRICS, "text/plain")) as srv, SocksProxy("relay") as proxy:
        for scheme, asked in (("socks5h", (3, "localhost")), ("socks5", (1, "127.0.0.1"))):
            monkeypatch.setenv("all_proxy", proxy.url(scheme))
            text, exc, _ = bounded(scrape(f"http://localhost:{srv.port}", 5.0), 15)
            assert exc is None and text == METRICS.decode(), (scheme, exc)
            assert proxy.asked[-1] == (*asked, srv.port), proxy.asked
        assert proxy.connections == 2 and len(srv.heads) == 2
        _, exc, took = bounded(scrape(f"http://metrics{HUNG}:9", 1.0), 15)
    assert isinstance(exc, SourceUnavailable), exc
    assert f"the name metrics{HUNG} was not resolved within 1 s" in str(exc), exc
    assert took < 3 and len(proxy.asked) == 2, (took, proxy.asked)


def test_a_socks_proxy_whose_own_name_hangs_is_under_the_deadline(
    hung_resolver: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("all_proxy", f"socks5h://proxy{HUNG}:1080")
    _, exc, took = bounded(scrape("http://127.0.0.1:9", 1.0), 15)
    assert isinstance(exc, SourceUnavailable), exc
    assert f"the name proxy{HUNG} was not resolved within 1 s" in str(exc), exc
    assert took < 3, took


def test_without_pysocks_a_socks_proxy_is_refused_with_one_line(tmp_path: Path) -> None:
    """A user without PySocks (not a dependency): one line that names the proxy, what is
    missing and the fix; before, `fleet` said "failed: InvalidSchema". A `socks` module that
    cannot be imported stands in for PySocks not being installed (a real process)."""
    (tmp_path / "socks.py").write_text('raise ImportError("PySocks is not installed here")\n')
    with RawServer(trickle_headers(0.2)) as srv:
        env = {
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
            "all_proxy": "socks5h://user:sock-secret-1@127.0.0.1:9",
            "no_proxy": "",
        }
        r = vd("fleet", "--prometheus", srv.url, "--since", "1d", env=env, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.startswith("vramdoctor: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert errors[0].startswith(
        f"vramdoctor: error: Prometheus at {srv.url} was not reached: the proxy "
        "socks5h://127.0.0.1:9 is a SOCKS proxy, and SOCKS needs PySocks, which is not "
        "installed: pip install 'vramdoctor[socks]' ("
    ), errors[0]
    assert "to reach it directly: no_proxy=127.0.0.1" in errors[0], errors[0]
    assert srv.heads == [] and "sock-secret-1" not in r.stderr
