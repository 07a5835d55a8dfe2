"""The KV pool layer: used tokens at idle, per pool, at the pool's real resolution (one page).

The KV pool is preallocated when the server starts, so its leaks never move NVML. They show
in the server's own accounting: SGLang counts used = total - available - evictable (cached
prefixes are evictable, not used) and vLLM v1 keeps freed prefix-cached blocks in its free
queue, so a healthy pool holds 0 used tokens at idle (no running, no queued request). Residue
that grows with requests is a leak (the classic one: one page per request never freed, what
SGLang's idle self-check exists for); residue that stays flat is held, not leaking. Each pool
the server exposes (SGLang: full, SWA, mamba) is judged on its own, with a floor of one page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vramdoctor.judge.layers.vram import time_driven_rate, worst
from vramdoctor.judge.results import (
    C_KV_RATIO_ONLY,
    C_NOT_IDLE_FILTERED,
    C_PAGE_SIZE_ASSUMED,
    CACHING,
    KV,
    LEAK,
    NOT_MEASURED,
    R_GREW_EVERY_ROUND,
    R_NO_LEVEL,
    STABLE,
    X_KV_RESIDUE,
    Culprit,
    KvPoolResult,
    LayerResult,
    Projection,
    SeriesResult,
    Thresholds,
)
from vramdoctor.judge.series import Series
from vramdoctor.samples import MIB

if TYPE_CHECKING:
    from vramdoctor.judge.layers import LayerContext


def _exact_creep(s: SeriesResult) -> None:
    """Used tokens at idle are an exact count with no noise, and nothing is cached in them (a
    radix-cached prefix is evictable, not used): residue that rises in every round, by more
    than one page over the rounds after the first, is a leak even when each round adds less
    than a page (2 tokens per request x 30 requests: 60 tokens a round)."""
    if s.verdict not in (CACHING, STABLE) or s.unit != "tokens" or s.noise > 0:
        return
    incs = s.increments
    if len(incs) < 2 or not all(d > 0 for d in incs) or s.slope_ci is None or s.slope_ci[0] <= 0:
        return
    if sum(incs) >= s.threshold:
        s.verdict, s.reason, s.creep_floor_per_request = LEAK, R_GREW_EVERY_ROUND, None


def _per_request(
    s: SeriesResult, page: int | None, bpt: float | None, pool_mib: float | None
) -> tuple[float | None, float | None, float | None]:
    """A leaking pool's growth per request: (tokens, pages, MiB); for a pool read only as a
    usage ratio, only the MiB (the ratio's share per request x the pool's MiB); each None
    where not leaking or not known."""
    if s.unit == "ratio":
        share = s.slope_per_request if s.verdict == LEAK else None
        return None, None, share * pool_mib if share is not None and pool_mib else None
    tpr = s.slope_per_request if s.verdict == LEAK else None
    return (
        tpr,
        tpr / page if tpr is not None and page else None,
        tpr * bpt / MIB if tpr is not None and bpt else None,
    )


def _pool_result(
    s: SeriesResult, src: Series, pool_mib: float | None, n_pools: int
) -> tuple[KvPoolResult, list[str]]:
    """(the pool's `KvPoolResult`, the caveats it adds) for one judged pool series `s`, with
    what the server said of the pool (`src`) and the KV pool's MiB (`pool_mib`, which gives
    the bytes per token where the run has `n_pools` == 1)."""
    caveats: list[str] = []
    # Unknown page size: tokens only (SGLang's default page is 1 token, vLLM's 16: no
    # size is assumed; the floor is then one token, the count's own resolution).
    page_assumed = not src.page_size_tokens
    page = src.page_size_tokens or None
    bpt = src.bytes_per_token
    if bpt is None and pool_mib and src.total_tokens and n_pools == 1:
        bpt = pool_mib * MIB / src.total_tokens  # the pool's bytes over its tokens (one pool)
    if s.unit == "ratio":
        caveats.append(C_KV_RATIO_ONLY)
    tokens, pages, mib = _per_request(s, page, bpt, pool_mib)
    pool = KvPoolResult(
        pool=s.pool or "kv",
        unit="ratio" if s.unit == "ratio" else "tokens",
        total_tokens=src.total_tokens,
        page_size_tokens=page,
        page_size_assumed=page_assumed,
        bytes_per_token=bpt,
        idle_residue=s.last,
        tokens_per_request=tokens,
        pages_per_request=pages,
        mib_per_request=mib,
        source=src.source,
        series=s.key,
    )
    if page_assumed and s.unit == "tokens":
        caveats.append(C_PAGE_SIZE_ASSUMED)
    if not src.idle_verified:
        caveats.append(C_NOT_IDLE_FILTERED)
    return pool, caveats


def _leak_details(
    lay: LayerResult, top: SeriesResult, pools: list[KvPoolResult], raw: dict[str, Series]
) -> None:
    """Fills a leaking layer from its top pool series, in place (returns nothing): the
    culprit, the rate per request (tokens or ratio; and MiB), and the projection of the
    free tokens (or free ratio) left, in requests."""
    pool = next(p for p in pools if p.series == top.key)
    lay.culprit = Culprit(top.key, pool=top.pool, cause="kv_pages")
    lay.rate_per_request = top.slope_per_request
    lay.rate_ci = top.slope_ci
    lay.rate_mib_per_request = pool.mib_per_request
    rate = top.slope_per_request
    if top.unit == "ratio":
        left = None if top.last is None else max(0.0, 1.0 - top.last)
    else:
        total = raw[top.key].total_tokens
        left = None if total is None or top.last is None else max(0.0, total - top.last)
    lay.projection = Projection(
        capacity_left=left,
        capacity_of="kv_free_tokens" if top.unit == "tokens" else "kv_free_ratio",
        requests=left / rate if left is not None and rate and rate > 0 else None,
    )
    time_driven_rate(lay, top)


def kv_layer(
    series: list[SeriesResult],
    raw: dict[str, Series],
    life: int,
    pool_mib: float | None,
    th: Thresholds,
) -> LayerResult:
    """The KV verdict of one life from its judged pool series (tokens, or a ratio)."""
    mine = [s for s in series if s.layer == KV]
    if not mine:
        return LayerResult(KV, NOT_MEASURED, R_NO_LEVEL, "tokens", life=life)
    pools: list[KvPoolResult] = []
    caveats: list[str] = []
    for s in mine:
        _exact_creep(s)
        pool, pool_caveats = _pool_result(s, raw[s.key], pool_mib, len(mine))
        pools.append(pool)
        caveats += pool_caveats
        residue = s.last
        # Flat but nonzero at idle: tokens held and not released (not a leak, said so).
        if s.verdict in (STABLE, CACHING) and residue is not None and residue >= s.threshold > 0:
            s.explanation = X_KV_RESIDUE
    verdict = worst(mine)
    assert verdict is not None
    cands = [s for s in mine if s.verdict == verdict]
    top = max(
        cands,
        key=lambda s: (s.slope_per_request or 0.0) if verdict == LEAK else abs(s.growth or 0.0),
    )
    lay = LayerResult(
        KV,
        verdict,
        top.reason,
        top.unit,
        growth=top.growth,
        life=life,
        caveats=sorted(set(caveats)),
        kv_pools=pools,
        series=mine,
        main_series=top.key,
        explanation=top.explanation,
    )
    if verdict == LEAK:
        _leak_details(lay, top, pools, raw)
    return lay


class KvLayer:
    """The KV pool layer behind the registry's signature (`vramdoctor.judge.layers.Layer`)."""

    name = KV
    unit = "tokens"

    def extract(self, records: Sequence[Any]) -> dict[str, Series]:
        """None of its own: KV series come from `judge.series.extract_series`."""
        return {}

    def judge(self, ctx: LayerContext) -> LayerResult:
        return kv_layer(ctx.series, dict(ctx.raw), ctx.life, ctx.facts.pool_mib, ctx.th)


LAYER = KvLayer()
