"""The KV pool's sentences: used tokens at idle from the server's /metrics.

The pool is preallocated, so a KV leak never shows in nvidia-smi: it is tokens (pages) that
stay used at idle with no request running or queued. Held tokens that do not grow are a
residue, not a leak; a healthy idle pool holds 0.
"""

from __future__ import annotations

from types import MappingProxyType

from vramdoctor.judge.results import (
    C_KV_RATIO_ONLY,
    C_NOT_IDLE_FILTERED,
    C_PAGE_SIZE_ASSUMED,
    KV,
    X_KV_RESIDUE,
    LayerResult,
    SoakAnalysis,
)
from vramdoctor.soak.report.layers.base import LayerBlock, main_series
from vramdoctor.soak.report.series import label
from vramdoctor.soak.report.text import count, known, rate, size, value
from vramdoctor.units import format_count

__all__ = ["KvBlock"]


class KvBlock(LayerBlock):
    """Tokens (and pages of the server's page size) held at idle per request."""

    layer = KV
    display = "KV pool"
    not_measured = "the server exports no KV gauge; SGLang needs --enable-metrics"
    runs_out = "the KV pool is full"
    caveats = MappingProxyType(
        {
            C_PAGE_SIZE_ASSUMED: (
                "the server does not say its KV page size: the rate is in tokens "
                "only (SGLang's default page is 1 token, vLLM's 16)"
            ),
            C_KV_RATIO_ONLY: "pool size unknown: judged on the usage ratio, not tokens",
            C_NOT_IDLE_FILTERED: "no running/queued gauges: idle samples could not be checked for "
            "requests in flight",
        }
    )

    def leak(self, lay: LayerResult, a: SoakAnalysis, *, ci: str, proj: str) -> str:
        pool = next((p for p in lay.kv_pools if p.series == lay.main_series), None)
        if pool is not None and pool.unit == "tokens":
            parts = []
            if pool.page_size_tokens and known(pool.pages_per_request):
                parts.append(
                    f"{count(round(pool.pages_per_request or 0.0, 2), 'page')} of "
                    f"{format_count(pool.page_size_tokens, 'tokens')}"
                )
            if known(pool.mib_per_request):
                parts.append(size(pool.mib_per_request))
            what = rate(pool.tokens_per_request, "tokens") + (
                f" ({', '.join(parts)})" if parts else ""
            )
        else:
            what = rate(lay.rate_per_request, lay.unit)
        return (
            f"{self.display} {lay.culprit.pool if lay.culprit else ''}: LEAK: {what} stay used at "
            f"idle per request{ci}, with no request running or queued: KV pages never freed (the "
            f"pool is preallocated, so this never shows in nvidia-smi){proj}."
        )

    def explained(self, lay: LayerResult, a: SoakAnalysis) -> str | None:
        s = main_series(lay)
        if lay.explanation == X_KV_RESIDUE and s is not None:
            return (
                f"{self.display}: {lay.verdict}: {label(s)} holds {value(s.last, s.unit)} at idle "
                f"(0 running, 0 queued) that do not grow with requests: held and not released, "
                f"but not a leak (a healthy idle pool holds 0)."
            )
        return None

    def stable(self, lay: LayerResult, a: SoakAnalysis) -> str | None:
        s = main_series(lay)
        if s is None:
            return None
        return f"{self.display}: STABLE: {value(s.last, s.unit)} used at idle after every round (healthy)."

    def short_leak(self, lay: LayerResult) -> str | None:
        pool = next((p for p in lay.kv_pools if p.series == lay.main_series), None)
        if pool is None or pool.unit != "tokens":
            return None
        pages = (
            f" ({count(round(pool.pages_per_request or 0.0, 2), 'page')})"
            if pool.page_size_tokens and known(pool.pages_per_request)
            else ""
        )
        return f"the KV pool leaks {rate(pool.tokens_per_request, 'tokens')}{pages} per request"


BLOCK = KvBlock()
