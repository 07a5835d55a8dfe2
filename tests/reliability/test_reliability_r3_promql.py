"""Label names from the database are never put into PromQL unquoted.

Prometheus 3.x stores UTF-8 label names; an exporter that names a label
`a="b"} or vector(1) or {c` would have had fleet's per-series selector
(`vramdoctor.fleet.promql.select_exact`) carry PromQL of its choosing. A name that is not a
classic (or dotted) one is now quoted (Prometheus 3.0 syntax), so it stays one name.
"""

from __future__ import annotations

from vramdoctor.fleet.promql import label_name, select_exact

HOSTILE = 'a="b"} or vector(1) or {c'


def test_a_hostile_label_name_stays_inside_one_quoted_name() -> None:
    sel = select_exact("vramdoctor_gpu_used", {HOSTILE: "v", "instance": "h:9400"})
    assert sel == (
        '{__name__="vramdoctor_gpu_used","a=\\"b\\"} or vector(1) or {c"="v",instance="h:9400"}'
    )
    # outside string literals, the selector has no operator and one pair of braces
    outside, in_str, esc = [], False, False
    for ch in sel:
        if in_str:
            esc, in_str = (not esc and ch == "\\"), in_str if (esc or ch != '"') else False
            continue
        if ch == '"':
            in_str = True
            continue
        outside.append(ch)
    bare = "".join(outside)
    assert bare == "{__name__=,=,instance=}", bare


def test_classic_and_utf8_names() -> None:
    assert label_name("instance") == "instance"
    assert label_name("k8s.pod") == "k8s.pod"  # VictoriaMetrics parses it bare, not quoted
    assert label_name("a b") == '"a b"'
    assert label_name('x"}') == '"x\\"}"'
    assert label_name("_x9") == "_x9"
    assert label_name("9x") == '"9x"'
