"""SGLang's KV token pool could not give a batch its slots: the scheduler raised and died.

SGLang's allocation failure ("Prefill out of memory. Try to lower your batch size." / "Decode out of
memory. ..." / "Out of memory. Try to lower your batch size.", 0.1's "... This should never happen.")
is fatal in every version: `alloc_token_slots` / `alloc_paged_token_slots_extend` / `..._decode` log
it and raise RuntimeError (2024: exit(1)). It is not the retraction line ("Decode out of memory
happened. #retracted_reqs: N" / "KV cache pool is full. Retract requests."), which is SGLang handling
a full pool without dying, and not a CUDA OOM: the pool is preallocated, GPU memory does not move.
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding, LogEvent
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence

_PHASE = {
    "prefill": "while admitting a prefill batch",
    "decode": "while giving the running requests their next decode slots",
}


def _figures(e: LogEvent) -> str:
    """'asked for 8192 tokens, 6342 available (free + evictable)' from the lines after the message."""
    want = e.data.get("requested_tokens")
    pools: dict[str, dict[str, int]] = e.data.get("pools") or {}
    parts: list[str] = []
    if want is not None:
        parts.append(f"it asked for {want} token slots")
    for name, p in pools.items():
        if "available_tokens" not in p:
            continue
        where = "" if name == "token" else f" in the {name} pool"
        split = ""
        if "free_tokens" in p and "evictable_tokens" in p:
            split = f" ({p['free_tokens']} free + {p['evictable_tokens']} evictable from the prefix cache)"
        elif "evictable_tokens" in p:
            split = f" ({p['evictable_tokens']} evictable)"
        parts.append(f"{p['available_tokens']} were available{where}{split}")
    if not parts:
        return "the log does not show how many slots it asked for"
    short = e.data.get("short_pool")
    text = ", ".join(parts)
    if short and short != "token" and len(pools) > 1:
        text += f"; the {short} pool is the one that ran short"
    return text


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("kv_pool_exhausted")
    if not evs or d.server != "sglang":  # SGLang's own message (it votes for SGLang)
        return []
    n = d.event_counts.get("kv_pool_exhausted", len(evs))
    e = evs[0]
    phases = {x.phase for x in evs if x.phase}
    phase = e.phase or (next(iter(phases)) if len(phases) == 1 else None)
    when = _PHASE.get(phase or "", "at an allocation")
    if phase == "prefill":
        first = (
            "Lower --chunked-prefill-size (a prefill chunk takes its slots at once) and "
            "--max-running-requests"
        )
    else:
        first = "Lower --max-running-requests and --chunked-prefill-size"
    return [
        Finding(
            RULE.id,
            "critical",
            f"SGLang's KV pool ran out {when}: the scheduler crashed (not a CUDA OOM)",
            explanation=(
                f"`{e.text[:160]}` ({n} failure line(s)): SGLang's scheduler asked its KV token pool for "
                f"slots {when} and got none; {_figures(e)}. The allocation raises and the scheduler process "
                "dies, taking the server with it. GPU memory did not grow: the pool is preallocated at "
                "start-up (its size set by --mem-fraction-static), so this is the pool's token accounting, "
                "not VRAM. The scheduler's admission check (prefill) and retraction (decode) exist to keep "
                "this from happening (SGLang 0.1's message said 'This should never happen'): when it does, "
                "it is a scheduler accounting bug of that version, seen with --page-size > 1, speculative "
                "decoding, the overlap scheduler, HiCache, hybrid SWA/mamba pools and KV slot leaks "
                "(sglang#7353, #26265, #34676)."
            ),
            fix=(
                f"{first}, and raise --schedule-conservativeness (e.g. 1.3) so the scheduler admits less per "
                "batch; raise --mem-fraction-static if the GPU has headroom, for a bigger pool. If a KV "
                "self-check leak finding is also reported, that leak is the cause. Upgrade SGLang (these "
                "accounting bugs get fixed); with --page-size > 1 or speculative decoding, --page-size 1 or "
                "--disable-overlap-schedule confirms the trigger."
            ),
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="sglang-kv-pool-exhausted",
    severity="critical",
    title="SGLang KV pool exhausted at allocation (scheduler crash)",
    fires_when=(
        "SGLang 'Prefill out of memory. Try to lower your batch size.' / 'Decode out of memory. ...' / "
        "'Out of memory. Try to lower your batch size.' (alloc_token_slots, alloc_paged_token_slots_*; "
        "0.1 '... This should never happen.'), with 'Try to allocate N tokens.' and the available/evictable "
        "tokens read from the lines after it"
    ),
    fix=(
        "lower --max-running-requests / --chunked-prefill-size, raise --schedule-conservativeness or "
        "--mem-fraction-static, upgrade"
    ),
    check=check,
)
