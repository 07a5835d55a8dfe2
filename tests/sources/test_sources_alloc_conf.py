"""PyTorch allocator settings: keys of newer releases are kept, never errors; torch's order of
the environment variables; a real process's setting read from its environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from vramdoctor.sources.alloc_conf import KNOWN_KEYS, effective, merge, parse, process_alloc_conf

NEW_215 = (
    "expandable_segments:True,per_process_memory_fraction:0.8,throw_on_cudamalloc_oom:True,"
    "pinned_reserve_segment_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:4],"
    "expandable_segments_reserve_by_class:[kv:40G,act:8G],graph_capture_record_stream_reuse:True"
)


def test_keys_of_torch_211_to_215_parse_and_none_is_an_error() -> None:
    conf = parse(NEW_215)
    assert conf.unknown == () and conf.malformed == () and conf.notes == ()
    assert conf.get("roundup_power2_divisions") == "[256:1,512:2,>:4]"
    assert conf.get("expandable_segments_reserve_by_class") == "[kv:40G,act:8G]"
    assert conf.expandable_segments is True
    assert {"per_process_memory_fraction", "throw_on_cudamalloc_oom"} <= set(KNOWN_KEYS)


def test_a_key_from_a_release_after_ours_is_kept_and_said_not_refused() -> None:
    conf = parse("expandable_segments:False,pinned_future_knob_mb:32,garbage")
    assert conf.unknown == ("pinned_future_knob_mb",)
    assert conf.malformed == ("garbage",)
    assert conf.expandable_segments is False
    assert any("pinned_future_knob_mb" in n for n in conf.notes)
    assert parse(None).pairs == () and parse("").notes == ()


def test_merge_overrides_in_place_and_keeps_every_other_piece() -> None:
    text = "pinned_future_knob_mb:32,expandable_segments:False,roundup_power2_divisions:[256:1,>:4]"
    merged = merge(text, {"expandable_segments": "True"})
    assert merged == (
        "pinned_future_knob_mb:32,expandable_segments:True,roundup_power2_divisions:[256:1,>:4]"
    )
    assert merge(None, {"expandable_segments": "True"}) == "expandable_segments:True"
    # PyTorch applies pairs in order: the last duplicate is the one replaced.
    assert merge("max_split_size_mb:64,max_split_size_mb:128", {"max_split_size_mb": "256"}) == (
        "max_split_size_mb:256"
    )


def test_pytorch_alloc_conf_wins_over_the_deprecated_cuda_name() -> None:
    both = effective({"PYTORCH_ALLOC_CONF": "backend:native", "PYTORCH_CUDA_ALLOC_CONF": "x:1"})
    assert both.source == "PYTORCH_ALLOC_CONF" and both.get("backend") == "native"
    assert any("PYTORCH_CUDA_ALLOC_CONF is set too" in n for n in both.notes)
    old = effective({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert old.source == "PYTORCH_CUDA_ALLOC_CONF" and old.expandable_segments
    rocm = effective({"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.7"}, hip=True)
    assert rocm.source == "PYTORCH_HIP_ALLOC_CONF"
    assert effective({}).source is None


def test_a_running_process_setting_and_nothing_else_of_its_environment() -> None:
    env = {**os.environ, "PYTORCH_ALLOC_CONF": NEW_215, "SECRET_TOKEN": "sk-live-abc"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        time.sleep(0.2)
        conf = process_alloc_conf(child.pid)
    finally:
        child.kill()
        child.wait()
    assert conf is not None and conf.source == "PYTORCH_ALLOC_CONF" and conf.text == NEW_215
    assert "sk-live-abc" not in repr(conf)
    assert process_alloc_conf(child.pid) is None  # gone
