"""A URL that cannot be right: `watch --server 'http://[::1'` is never "internal error: ValueError".

Every URL option of every command, given a URL that cannot be right (an IPv6 literal never
closed, a port out of range), is one line naming the URL and exit 2, never an internal error:
the URL is checked before anything else uses it (watch's server discovery and soak's credential
check split it first; ab-test's port lookup goes through `sources.discover.url_port`).
"""

from __future__ import annotations

import pytest
from support.cli import vd

from vramdoctor.errors import InputError
from vramdoctor.sources import discover

BAD = ["http://[::1", "http://h:99999"]

COMMANDS = [
    ("soak", "--url", "{u}"),
    ("soak", "--url", "http://127.0.0.1:1", "--gpu-metrics", "{u}"),
    ("watch", "--server", "{u}", "--duration", "1s", "--no-exporter"),
    ("watch", "--gpu-metrics", "{u}", "--duration", "1s", "--no-exporter"),
    ("fleet", "--prometheus", "{u}", "--since", "1d"),
    ("census", "--gpu-metrics", "{u}"),
]


@pytest.mark.parametrize("url", BAD)
@pytest.mark.parametrize(
    "args",
    COMMANDS,
    ids=lambda a: " ".join(a[:2]) + (" " + a[3] if a[0] == "soak" and len(a) > 3 else ""),
)
def test_a_url_that_cannot_be_right_is_one_line_and_exit_2(args: tuple[str, ...], url: str) -> None:
    r = vd(*(a.format(u=url) for a in args), timeout=90)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("vramdoctor: error: ") and "URL" in last, r.stderr


def test_soak_with_an_api_key_and_a_bad_url_is_one_line() -> None:
    r = vd("soak", "--url", "http://[::1", env={"OPENAI_API_KEY": "sk-test-key-123"}, timeout=90)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "not a valid URL" in r.stderr and "internal error" not in r.stderr, r.stderr


@pytest.mark.parametrize("url", BAD)
def test_the_port_lookup_ab_test_uses_refuses_a_bad_url_with_input_error(url: str) -> None:
    for fn in (discover.url_port, discover.is_local, discover.port_refuses):
        with pytest.raises(InputError, match="not a valid URL"):
            fn(url)
