"""The reference server's command line: shared flags, each mode's own flags, and `main`.

`python examples/reference_server/server.py --mode MODE [flags]`; `--port 0` picks a free port.
The first line on stdout is `reference server listening on http://HOST:PORT mode=M device=D
processor=P pid=N` (tests read the URL and pid from it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from refserver import malloc
from refserver.modes import modes
from refserver.routes import make_handler
from refserver.state import State

DESCRIPTION = (
    "A small OpenAI-compatible server whose memory behaviour you choose: the soak test target."
)


def build_parser() -> argparse.ArgumentParser:
    """Every flag of every mode (argparse must know them before it knows the mode)."""
    registry = modes()
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on stdout)")
    p.add_argument("--mode", choices=list(registry), default="plain")
    p.add_argument(
        "--leak-kib",
        type=float,
        default=1024.0,
        help="KiB kept per request (CPU leak, and GPU with --leak-kind bytes)",
    )
    p.add_argument("--cache-mib", type=float, default=64.0, help="CPU cache bound (plain/leaking)")
    p.add_argument(
        "--cache-entry-kib",
        type=float,
        default=4096.0,
        help="CPU cache: KiB of features kept per unique image",
    )
    p.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="leave glibc malloc as it is (its own caching then adds a few MiB of RSS)",
    )
    p.add_argument(
        "--metrics-flavour",
        choices=["reference", "sglang", "vllm"],
        default="reference",
        help="also publish KV usage under SGLang's or vLLM's metric names",
    )
    p.add_argument(
        "--kv-pool-tokens",
        "--kv-capacity",
        dest="kv_capacity",
        type=int,
        default=100_000,
        help="KV pool size in tokens",
    )
    p.add_argument(
        "--kv-page-size",
        type=int,
        default=16,
        help="tokens per KV page (SGLang --page-size; vLLM block_size), published in "
        "/get_server_info (sglang flavour) and vllm:cache_config_info",
    )
    p.add_argument(
        "--stream-token-s", type=float, default=0.01, help="seconds between streamed tokens"
    )
    p.add_argument(
        "--models-status",
        type=int,
        default=200,
        help="answer GET /v1/models with this HTTP status (500: as transformers serve without an HF cache)",
    )
    p.add_argument(
        "--kv-tokens-per-request", type=int, default=1024, help="KV tokens a request holds"
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--processor-dir",
        default=None,
        help="a local dir with preprocessor_config.json (default: Qwen2-VL's processor)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("REFERENCE_API_KEY"),
        help="require this bearer key (default: $REFERENCE_API_KEY; none)",
    )
    from refserver import device, faults
    from refserver.lifecycle import Lifecycle

    faults.add_arguments(p)
    device.add_arguments(p)
    Lifecycle.add_arguments(p)
    seen: set[type] = set()
    for cls in registry.values():
        # A subclass's own flags only: a flag its base added is added once, by the base.
        for klass in reversed(cls.__mro__):
            if "add_arguments" in vars(klass) and klass not in seen:
                seen.add(klass)
                klass.add_arguments(p)  # type: ignore[attr-defined]
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.fail_start:
        from refserver.faults import fail_start

        fail_start(args.fail_start)
    mode = modes()[args.mode](args)
    mode.prefork(args)
    if not args.no_malloc_tuning and mode.tune_malloc:  # some modes are glibc's defaults
        malloc.tune_malloc()
    if args.device == "auto":
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.device = "cpu"
    state = State(args, mode)
    state.warm_up()
    server = mode.make_server(state, make_handler(state))
    host, port = server.server_address[:2]
    args.bound_port = port
    processor = state.gpu.name if state.gpu else "pillow-numpy (CPU)"
    print(
        f"reference server listening on http://{host}:{port} mode={args.mode} "
        f"device={args.device} processor={processor} pid={os.getpid()}",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        mode.stop(state)
        state.gpu_mem.close()
    return mode.exit_code


if __name__ == "__main__":
    sys.exit(main())
