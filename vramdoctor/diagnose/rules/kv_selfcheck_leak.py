"""SGLang's idle KV self-check found slots unaccounted for (KV page accounting, not VRAM)."""

from __future__ import annotations

from typing import Any

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence


def _deficit(leaked: int) -> str:
    if leaked > 0:
        return f"{leaked} slot(s) unaccounted for"
    if leaked < 0:
        return f"{-leaked} slot(s) counted twice"
    return "balanced"


def _numbers(data: dict[str, Any]) -> str:
    pools = data.get("pools") or {}
    if pools:
        # every pool the check printed (0.5.12+ [full]/[swa]/[mamba], hybrid full/mamba): the deficit
        # of each is total minus every count it adds up (available, evictable, protected, held...)
        parts = []
        for name, p in pools.items():
            counts = ", ".join(
                f"{k}={v}" for k, v in p.items() if k not in ("leaked", "leaked_pages")
            )
            s = f"[{name}] {counts} -> {_deficit(p['leaked'])}"
            if p.get("leaked_pages") not in (None, "None"):
                s += f" (leaked pages {p['leaked_pages']})"
            parts.append(s)
        return "; ".join(parts)
    if "total" not in data:
        return "numbers not printed in this wording"
    s = (
        f"total={data['total']}, available={data['available']}, evictable={data['evictable']}, "
        f"protected={data['protected']}"
    )
    return s + f" -> {_deficit(data['leaked'])}"


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("kv_leak_selfcheck")
    if not evs or d.server != "sglang":  # SGLang's own line (it votes for SGLang)
        return []
    double = [
        e
        for e in evs
        if e.data.get("double_free")
        or any(p.get("leaked", 0) < 0 for p in (e.data.get("pools") or {}).values())
    ]
    fatal = any("ValueError" in e.text or "Exception" in e.text for e in evs)
    pools = sorted({e.data.get("pool", "token") for e in evs})
    detail = "; ".join(f"{e.data.get('pool')}: {_numbers(e.data)}" for e in evs[:3])
    explanation = (
        f"SGLang's idle memory self-check ({', '.join(pools)} pool) found that KV/request slots do not "
        f"add up: {detail}. This is the scheduler's page accounting (available + evictable + "
        "protected must equal total when idle), not the CUDA allocator: VRAM does not grow from it, "
        "but lost slots shrink the usable KV cache and the check raises ValueError and kills the "
        "scheduler unless SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=0 (then a warning every 1000 checks)."
    )
    if double:
        explanation += (
            " A pool counts more slots than it has (available > total, or a negative deficit): a "
            "slot freed twice or counted in two places (double free / double count)."
        )
    explanation += (
        " Known regressions: sglang #11970 (0.5.3.post3), #6888, #7130 (page_size > 1 with MTP/EAGLE), "
        "#6258 (PD disaggregation, DP decode side)."
    )
    return [
        Finding(
            id=RULE.id,
            severity="critical" if fatal or double else "warning",
            title="SGLang KV self-check reports leaked KV slots"
            + (" (double free)" if double else ""),
            evidence=first_evidence(evs),
            explanation=explanation,
            fix=(
                "Upgrade SGLang (the known regressions are fixed in later releases); meanwhile disable "
                "the feature in the regression (speculative decoding/MTP with page_size > 1, radix cache "
                "with --disable-radix-cache, overlap scheduler with --disable-overlap-schedule) to "
                "isolate it, and report the numbers upstream. SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=0 "
                "keeps the server up but does not recover the slots."
            ),
        )
    ]


RULE = Rule(
    id="sglang-kv-selfcheck-leak",
    severity="critical",
    title="SGLang KV self-check leak",
    fires_when=(
        "any wording of SGLang's idle/busy pool check: 'token_to_kv_pool_allocator memory leak "
        "detected!', 'req_to_token_pool memory leak detected!', 'pool memory leak detected! [full] ...', "
        "'Mem Leak Detected!', 'KV cache pool leak detected!'"
    ),
    fix="upgrade past the known regressions, isolate the feature (spec decoding, radix cache, overlap), report upstream",
    check=check,
)
