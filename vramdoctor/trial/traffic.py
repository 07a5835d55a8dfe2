"""Traffic for a trial: bursts of small chat requests with idle gaps between, until stopped.

Production-shaped enough for watch (it compares quiet moments, so it needs some), cheap enough
for a laptop: `burst` text requests two at a time, then `idle_s` seconds of nothing.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["Bursts"]


class Bursts:
    """Send bursts to `base_url` (an OpenAI-compatible server) on a thread of its own.

    `start()` begins, `stop()` ends it and waits; `sent` and `failed` count requests. The
    model is the server's first /v1/models id. Errors are counted, never raised.
    """

    def __init__(
        self, base_url: str, *, burst: int = 20, idle_s: float = 2.0, concurrency: int = 2
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.burst = burst
        self.idle_s = idle_s
        self.concurrency = concurrency
        self.sent = 0
        self.failed = 0
        self._count = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="vramdoctor-try-traffic", daemon=True
        )

    def start(self) -> Bursts:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _model(self, session: object) -> str:
        import requests

        assert isinstance(session, requests.Session)
        try:
            data = session.get(self.base_url + "/v1/models", timeout=5).json()
            return str(data["data"][0]["id"])
        except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
            return "reference"

    def _one(self, session: object, model: str, n: int) -> None:
        import requests

        assert isinstance(session, requests.Session)
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": f"Describe request {n} in one word."}],
            "max_tokens": 8,
        }
        try:
            r = session.post(self.base_url + "/v1/chat/completions", json=body, timeout=30)
            ok = r.status_code < 400
        except requests.RequestException:
            ok = False
        with self._count:
            self.sent += 1
            self.failed += 0 if ok else 1

    def _run(self) -> None:
        import requests

        with requests.Session() as session, ThreadPoolExecutor(self.concurrency) as pool:
            session.trust_env = False  # loopback: never through a proxy from the environment
            model = self._model(session)
            n = 0
            while not self._stop.is_set():
                futures = [pool.submit(self._one, session, model, n + i) for i in range(self.burst)]
                for f in futures:
                    f.result()
                n += self.burst
                self._stop.wait(self.idle_s)
