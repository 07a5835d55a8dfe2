"""kv-leaking: a KV page leak, memory as in stable.

`--kv-leak-tokens` of each request's KV tokens are never returned to the pool (`--kv-leak-on
abort`: only for streamed requests the client abandons). Publish it with `--metrics-flavour
sglang` or `vllm`: used tokens at idle creep up (SGLang: used = total - available - evictable,
0 when healthy; vLLM: usage = 1 - free/total blocks, 0 when healthy).

TRUTH: kv LEAK at `kv_leak_tokens_per_request` tokens per (aborted) request; VRAM and host
STABLE: the pool is preallocated, its leak never moves NVML.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from refserver.request import Request
    from refserver.state import State


class KvLeakingMode(Mode):
    name = "kv-leaking"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--kv-leak-on",
            choices=["every", "abort"],
            default="every",
            help="kv-leaking: leak on every request, or only on requests the client abandons mid-stream",
        )
        parser.add_argument(
            "--kv-leak-tokens",
            type=int,
            default=200,
            help="kv-leaking: tokens of each request never returned to the KV pool",
        )

    def kv_tokens_kept(self, state: State, req: Request) -> int:
        if self.args.kv_leak_on == "every" or req.aborted:
            return int(self.args.kv_leak_tokens)
        return 0

    def kv_leak_tokens_per_request(self, state: State) -> int:
        return int(self.args.kv_leak_tokens)

    def truth(self, state: State) -> dict[str, Any]:
        on = "every request" if self.args.kv_leak_on == "every" else "every aborted stream"
        return {
            "summary": f"{self.args.kv_leak_tokens} KV tokens of {on} never return to the pool",
            "layers": {
                "vram": layer("STABLE", "the KV pool is preallocated: its leak never moves NVML"),
                "kv": layer(
                    "LEAK",
                    f"tokens of {on} never freed: used tokens at idle creep up",
                    tokens_per_request=int(self.args.kv_leak_tokens),
                    **({"feature": "abort"} if self.args.kv_leak_on == "abort" else {}),
                ),
                "host": layer("STABLE", "nothing is kept on the host"),
            },
        }


MODES = [KvLeakingMode]
