"""`vramdoctor diagnose`: read SGLang/vLLM logs, extract facts and events, run the rules.

Pipeline: `reader` (streaming, prefiltered) -> `extract` (facts, events per file) ->
`diagnose` (merge across files) -> `rules` (one finding per rule file).
"""

from __future__ import annotations

from vramdoctor.diagnose.diagnosis import diagnose
from vramdoctor.diagnose.findings import SCHEMA, Diagnosis, Evidence, Facts, Finding, LogEvent

__all__ = ["SCHEMA", "Diagnosis", "Evidence", "Facts", "Finding", "LogEvent", "diagnose"]
