"""Proxies: a URL the environment's proxy would carry is named, at start and in an error.

A loopback server behind `http_proxy` (no `no_proxy` for it) looks down: the proxy answers for
it. requests' own rule (`get_environ_proxies`: the *_proxy variables, no_proxy honoured) says
which URLs go through which proxy; the proxy is shown redacted (its password never printed).
"""

from __future__ import annotations

import os
import re

from vramdoctor.render import console

__all__ = ["name_proxies", "note_proxies", "proxy_of"]

_URL = re.compile(r"https?://[^\s'\"<>),;]*[^\s'\"<>),;:.]")


def proxy_of(url: str) -> tuple[str, str] | None:
    """The proxy that requests would send `url` through (http_proxy, https_proxy, all_proxy;
    no_proxy honoured), redacted, and the variable that names it; None when it goes direct."""
    if not any(k.lower().endswith("_proxy") and k.lower() != "no_proxy" for k in os.environ):
        return None
    try:
        from requests.utils import get_environ_proxies

        proxies = get_environ_proxies(url)
    except Exception:  # a malformed variable: requests would fail on its own, with its own words
        return None
    scheme = url.split(":", 1)[0].lower()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy:
        return None
    from vramdoctor.redact import redact_url

    names = [f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"]
    variable = next((n for n in names if os.environ.get(n) == proxy), names[0])
    return redact_url(proxy), variable


def proxy_words(url: str, proxy: tuple[str, str]) -> str:
    host = url.split("//", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    return (
        f"{url} is reached through the proxy {proxy[0]} ({proxy[1]}); to reach it directly: "
        f"no_proxy={host}"
    )


def name_proxies(message: str) -> str:
    """An error naming a URL that goes through a proxy says so (a loopback server behind
    `http_proxy` looks down when the proxy answers for it)."""
    for url in dict.fromkeys(_URL.findall(message)):
        proxy = proxy_of(url)
        if proxy is not None:
            return f"{message} ({proxy_words(url, proxy)})"
    return message


def note_proxies(args: list[str]) -> None:
    """Before the command: one note per URL on the command line that a proxy would carry."""
    for arg in args[: args.index("--")] if "--" in args else args:
        for url in _URL.findall(arg):
            proxy = proxy_of(url)
            if proxy is not None:
                console.note(f"note: {proxy_words(url, proxy)}")
