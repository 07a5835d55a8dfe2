"""What a soak run is asked to do: one typed, validated object.

`SoakConfig` is what the CLI builds from its options and what library users build in code;
`validate()` rejects every value that cannot be run (NaN, infinity, negative, out of range)
with one line naming the option, before anything is sent or recorded.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from vramdoctor.errors import InputError
from vramdoctor.redact import redact_url

if TYPE_CHECKING:
    from vramdoctor.soak.launch import LaunchSpec

DEFAULT_SIZES = ("448x448", "896x672")
MIN_GROWTH_MIB = 2.0  # NVML/DCGM report whole MiB; the allocator rounds to 2 MiB blocks
DEFAULT_MAX_ROUNDS = 12
INTERRUPTED = 130  # exit code of a soak stopped by Ctrl-C or SIGTERM
# Bounds that keep one option from asking for unbounded work.
MAX_REQUESTS_PER_ROUND = 10**9
MAX_ROUNDS = 10_000
MAX_SECONDS = 30 * 24 * 3600.0  # a month: anything longer is a typo


@dataclass(frozen=True)
class OptionDoc:
    """How a `SoakConfig` field is given on the command line: its flag and help (the one
    place both are written; `vramdoctor.cli.soak` builds its options from them). `cli_type`
    is the type on the command line when it is not the field's (a list for a tuple);
    `negate`: a bool field set by its negation (`--no-adapt` gives adapt=False); `parse`
    turns the command-line value into the field's."""

    flag: str
    help: str
    cli_type: Any = None
    negate: bool = False
    hidden: bool = False
    metavar: str | None = None
    parse: Callable[[Any], Any] | None = None


def _opt(flag: str, help: str, **kwargs: Any) -> dict[str, OptionDoc]:
    return {"option": OptionDoc(flag, help, **kwargs)}


def _tuple(values: Any) -> tuple[Any, ...]:
    return tuple(values or ())


def command_words(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """--launch 'CMD ARGS' (shell words) or an argv list -> the argv; None when not given."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise InputError(f"--launch {value!r}: {exc}") from None
    return tuple(value)


@dataclass
class SoakConfig:
    """A soak's settings. Durations are seconds, sizes MiB, rates requests per second.

    `rounds` identical rounds of `requests` requests at `concurrency`, each followed by
    `idle_s` of idle; while a layer is undecided after them, more rounds up to `max_rounds`
    (`adapt=False`: exactly `rounds`). `duration_s` and `max_requests` bound everything.
    `stream` streams every request; `abort_fraction` of each round's requests are streamed
    and closed by the client after the first chunks. `production_rate_rps` is the request rate
    projections use (default: the server's own counters during the baseline, when they show
    traffic). `api_key` is sent in the Authorization header only, never recorded.

    `launch`: the server's command; vramdoctor starts it (its own process group, the agent in
    its environment: `launch_env` on top, `launch_unset_env` removed), waits up to
    `startup_timeout_s` for it to answer, soaks it, stops it (SIGTERM, SIGKILL after
    `stop_grace_s`) and diagnoses its log (`vramdoctor.soak.launch`). `url` then defaults to
    the command's own `--port`/`--host`. Each field's command-line flag and help is its
    `OptionDoc` (`option_doc`).
    """

    url: str = field(
        default="",
        metadata=_opt(
            "--url",
            "The server's base URL, e.g. http://127.0.0.1:30000 (with --launch: default from "
            "the command's --port/--host).",
            parse=lambda v: v or "",
        ),
    )
    rounds: int = field(
        default=4, metadata=_opt("--rounds", "Rounds of identical traffic (at least).")
    )
    requests: int = field(default=50, metadata=_opt("--requests", "Requests per round."))
    concurrency: int = field(
        default=4, metadata=_opt("--concurrency", "Requests in flight at once.")
    )
    idle_s: float = field(
        default=10.0, metadata=_opt("--idle", "Idle seconds after each round (and the baseline).")
    )
    baseline_s: float | None = field(
        default=None,
        metadata=_opt("--baseline", "Idle seconds before the first round (default: --idle)."),
    )
    adapt: bool = field(
        default=True, metadata=_opt("--no-adapt", "Run exactly --rounds rounds.", negate=True)
    )
    max_rounds: int | None = field(
        default=None,
        metadata=_opt(
            "--max-rounds",
            f"While a memory layer is undecided after --rounds, run more rounds up to this many "
            f"(default: {DEFAULT_MAX_ROUNDS}, or --rounds when larger).",
        ),
    )
    image_sizes: tuple[str, ...] = field(
        default=DEFAULT_SIZES,
        metadata=_opt(
            "--image-size",
            "Generated image size WxH (repeatable). Default: 448x448 and 896x672.",
            cli_type=list[str] | None,
            parse=lambda v: tuple(v or DEFAULT_SIZES),
        ),
    )
    image_dir: Path | None = field(
        default=None, metadata=_opt("--image-dir", "Send these images instead (sorted by name).")
    )
    text_only: bool = field(
        default=False, metadata=_opt("--text-only", "No images: text prompts only.")
    )
    api: str = field(
        default="chat",
        metadata=_opt(
            "--api", "chat (/v1/chat/completions) or completions (/v1/completions, text)."
        ),
    )
    model: str | None = field(
        default=None,
        metadata=_opt(
            "--model",
            "Model name to send (default: the server's first /v1/models id). With --model, a "
            "failing /v1/models is only a note.",
        ),
    )
    max_tokens: int = field(
        default=16, metadata=_opt("--max-tokens", "max_tokens of each request.")
    )
    seed: int = field(
        default=0, metadata=_opt("--seed", "Seed of the generated images (same seed, same bytes).")
    )
    stream: bool = field(
        default=False, metadata=_opt("--stream", "Stream every response (server-sent events).")
    )
    abort_fraction: float = field(
        default=0.0,
        metadata=_opt(
            "--abort-fraction",
            "Share of each round's requests (0..1) streamed and closed by the client after the "
            "first tokens.",
        ),
    )
    out: Path | None = field(
        default=None,
        metadata=_opt("--out", "Run file (default: runs/soak-UTCTIME-PID-RANDOM.jsonl)."),
    )
    max_requests: int | None = field(
        default=None,
        metadata=_opt("--max-requests", "Never send more requests than this in total."),
    )
    duration_s: float | None = field(
        default=None, metadata=_opt("--duration", "Never run longer than this many seconds.")
    )
    api_key: str | None = field(
        default=None,
        repr=False,
        metadata=_opt(
            "--api-key",
            "Bearer key (default: $OPENAI_API_KEY or $VRAMDOCTOR_API_KEY). Never printed or "
            "recorded.",
        ),
    )
    interval_s: float = field(
        default=0.5, metadata=_opt("--interval", "Seconds between memory samples.")
    )
    timeout_s: float = field(
        default=120.0, metadata=_opt("--timeout", "Seconds to wait for one answer.")
    )
    min_growth_mib: float = field(
        default=MIN_GROWTH_MIB,
        metadata=_opt("--min-growth-mib", "Smallest change (MiB) that counts as growth."),
    )
    fail_on_inconclusive: bool = field(
        default=False,
        metadata=_opt(
            "--fail-on-inconclusive",
            "Exit 1 when the verdict is INCONCLUSIVE (a layer still undecided after the rounds, "
            "e.g. host growth that retention or a leak could explain): a CI gate then never "
            "passes an undecided run.",
        ),
    )
    gpu_metrics: str | None = field(
        default=None,
        metadata=_opt(
            "--gpu-metrics",
            "dcgm-exporter or nvitop-exporter URL when the server's GPUs are on another host "
            "(also --gpu-exporter).",
        ),
    )  # dcgm-exporter / nvitop-exporter URL
    gpus: tuple[int, ...] | None = None  # NVML indices (the CLI's --gpu, parsed there)
    pids: tuple[int, ...] = field(
        default=(),
        metadata=_opt(
            "--pid",
            "Also sample this PID's host memory (repeatable).",
            cli_type=list[int] | None,
            parse=_tuple,
        ),
    )
    production_rate_rps: float | None = field(
        default=None,
        metadata=_opt(
            "--production-rate",
            "Your production request rate (requests/s) for time-to-OOM in hours (default: the "
            "server's own request counters during the baseline, when they show traffic).",
        ),
    )
    launch: tuple[str, ...] | None = field(
        default=None,
        metadata=_opt(
            "--launch",
            "Start the server with this command, soak it, stop it: its own process group, the "
            "agent in its environment, its log in the run folder and diagnosed (also: -- CMD "
            "ARGS...).",
            cli_type=str | None,
            metavar="CMD",
            parse=command_words,
        ),
    )
    launch_env: Mapping[str, str] = field(default_factory=dict)  # set in the launched env
    launch_unset_env: tuple[str, ...] = ()  # removed from the launched env
    startup_timeout_s: float = field(
        default=600.0,
        metadata=_opt(
            "--startup-timeout", "With --launch: seconds to wait for the server to answer."
        ),
    )
    stop_grace_s: float = field(
        default=15.0,
        metadata=_opt(
            "--stop-grace", "With --launch: seconds between SIGTERM and SIGKILL at the end."
        ),
    )
    agent: bool = field(
        default=True,
        metadata=_opt(
            "--no-agent",
            "With --launch: do not put vramdoctor's agent in the server's environment.",
            negate=True,
        ),
    )

    attribute: str | None = field(
        default=None,
        metadata=_opt(
            "--attribute",
            "Name the code that holds growing GPU memory: DIR (the VRAMDOCTOR_AGENT_DIR of a "
            "server started with PYTHONPATH=$(vramdoctor agent-path)) or sglang[:DIR] (SGLang's "
            "/start_profile, scheduler processes only). See docs/attribute.md.",
        ),
    )
    trace_python: bool = field(
        default=False,
        metadata=_opt(
            "--trace-python",
            "With the agent in the server: also trace Python allocations by line (tracemalloc "
            "in the server while the soak runs; about 20 % more server CPU). See docs/attribute.md.",
        ),
    )
    # soak --vary / --cycle (vramdoctor.soak.vary, vramdoctor.soak.cycle; docs/soak.md)
    vary: str | None = field(
        default=None,
        metadata=_opt(
            "--vary",
            "FEATURE[,FEATURE...]: rounds that differ in one request feature at a time "
            "(images, image-size, multi-image, stream, abort, max-tokens, prefix, structured, "
            "regex, n, lora[:ADAPTER], or all), interleaved in seeded order; names the feature "
            "that leaks, with its rate per request. See docs/soak.md.",
        ),
    )
    cycle: str | None = field(
        default=None,
        metadata=_opt(
            "--cycle",
            "sleep[:LEVEL] | release | lora[:NAME[=PATH]]: between rounds, the server's own "
            "lifecycle operation through its endpoints; what remains after each cycle, per "
            "layer. See docs/soak.md.",
        ),
    )

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **fields_given: Any) -> SoakConfig:
        """The config from command-line values keyed by field name (each parsed by its
        `OptionDoc`; a negated flag inverted), plus fields given directly; validated."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            doc = f.metadata.get("option")
            if doc is None or f.name not in options:
                continue
            v = options[f.name]
            if doc.negate:
                v = not v
            if doc.parse is not None:
                v = doc.parse(v)
            values[f.name] = v
        values.update(fields_given)
        return cls(**values).validate()

    def launch_spec(self) -> LaunchSpec | None:
        """The launch of `launch` (None without it), with the env changes and timeouts."""
        if self.launch is None:
            return None
        from vramdoctor.soak.launch import LaunchSpec

        return LaunchSpec(
            argv=tuple(self.launch),
            env=dict(self.launch_env),
            unset_env=tuple(self.launch_unset_env),
            startup_timeout_s=self.startup_timeout_s,
            stop_grace_s=self.stop_grace_s,
            agent=self.agent,
        ).validate()

    def validate(self) -> SoakConfig:
        """Raise InputError (one line naming the option) for anything that cannot be run.
        With `launch` and no `url`, `url` is set from the command's --port/--host."""
        self._check_launch()
        from vramdoctor.sources.http import metrics_url

        for url in (self.url, self.gpu_metrics):  # `http://[::1`, port 99999: one line
            if url:
                metrics_url(url)
        _int_range("--rounds", self.rounds, 1, MAX_ROUNDS)
        _int_range("--requests", self.requests, 1, MAX_REQUESTS_PER_ROUND)
        _int_range("--concurrency", self.concurrency, 1, 1024)
        _int_range("--max-tokens", self.max_tokens, 1, 1_000_000)
        if self.max_rounds is not None:
            _int_range("--max-rounds", self.max_rounds, 1, MAX_ROUNDS)
        if self.adapt and self.max_rounds is not None and self.max_rounds < self.rounds:
            raise InputError(
                f"--max-rounds {self.max_rounds} is below --rounds {self.rounds}: "
                "raise it, or pass --no-adapt"
            )
        if self.max_requests is not None:
            _int_range("--max-requests", self.max_requests, 1, 10**12)
        _seconds("--idle", self.idle_s, zero_ok=True)
        if self.baseline_s is not None:
            _seconds("--baseline", self.baseline_s, zero_ok=True)
        if self.duration_s is not None:
            _seconds("--duration", self.duration_s)
        _seconds("--timeout", self.timeout_s)
        _seconds("--interval", self.interval_s)
        if self.interval_s < 0.05:
            raise InputError(f"--interval {self.interval_s:g}: must be at least 0.05 s")
        _finite("--abort-fraction", self.abort_fraction)
        if not 0.0 <= self.abort_fraction <= 1.0:
            raise InputError(f"--abort-fraction {self.abort_fraction:g}: must be between 0 and 1")
        from vramdoctor.soak.variations import check_options

        check_options(self.vary, self.cycle)
        _finite("--min-growth-mib", self.min_growth_mib)
        if self.min_growth_mib < 0:
            raise InputError("--min-growth-mib must not be negative")
        if self.production_rate_rps is not None:
            _finite("--production-rate", self.production_rate_rps)
            if not 0 < self.production_rate_rps <= 1e9:
                raise InputError(
                    f"--production-rate {self.production_rate_rps:g}: give requests per "
                    "second, more than 0"
                )
        if self.api not in ("chat", "completions"):
            raise InputError(f"--api {self.api!r}: use chat or completions")
        if self.text_only and self.image_dir:
            raise InputError("--text-only and --image-dir contradict each other")
        for pid in self.pids:
            _int_range("--pid", pid, 1, 2**31)
        self._check_credentials()
        return self

    def _check_launch(self) -> None:
        spec = self.launch_spec()
        if spec is None:
            if not self.url:
                raise InputError("give the server's --url (or --launch CMD to start it)")
            return
        if not self.url:
            derived = spec.url()
            if derived is None:
                raise InputError(
                    "--launch: the command names no --port; give --url (where it will listen)"
                )
            self.url = derived
            return
        from vramdoctor.sources.discover import is_local

        if not is_local(self.url):
            raise InputError(
                f"--launch starts the server on this host, but --url {redact_url(self.url)} is "
                "another host: drop --url, or give this host's address"
            )

    def _check_credentials(self) -> None:
        """A user:password in --url and an API key cannot both be sent: HTTP has one
        Authorization header, and the URL's Basic credentials would replace the bearer key
        (the key was then silently never sent). Refused with one line (exit 2)."""
        if not self.resolved_api_key:
            return
        netloc = urlsplit(self.url if "://" in self.url else "http://" + self.url).netloc
        if "@" not in netloc:
            return
        source = (
            "--api-key"
            if self.api_key
            else "$OPENAI_API_KEY"
            if os.environ.get("OPENAI_API_KEY")
            else "$VRAMDOCTOR_API_KEY"
        )
        raise InputError(
            f"--url carries a user:password and an API key is set ({source}): both would "
            "go in the one Authorization header; drop the user:password from --url to "
            f"send the key, or unset {source} to send the URL's password (HTTP Basic)"
        )

    @property
    def rounds_cap(self) -> int:
        """The most rounds this run may take: `rounds` without adapting, else `max_rounds`
        (default the larger of 12 and `rounds`)."""
        if not self.adapt:
            return self.rounds
        return (
            self.max_rounds if self.max_rounds is not None else max(DEFAULT_MAX_ROUNDS, self.rounds)
        )

    @property
    def baseline(self) -> float:
        return self.idle_s if self.baseline_s is None else self.baseline_s

    @property
    def resolved_api_key(self) -> str | None:
        """The key to send: the field, else $OPENAI_API_KEY, else $VRAMDOCTOR_API_KEY."""
        return (
            self.api_key
            or os.environ.get("OPENAI_API_KEY")
            or os.environ.get("VRAMDOCTOR_API_KEY")
            or None
        )

    def to_record(self) -> dict[str, Any]:
        """The settings as recorded in the run file's header (no key, paths as strings)."""
        d = asdict(self)
        d.pop("api_key", None)
        d.pop("url", None)  # the header's target carries it, redacted
        if self.attribute is None:
            d.pop("attribute", None)
        if not self.trace_python:
            d.pop("trace_python", None)
        # The session records a launch itself, redacted (`LaunchedServer.to_record`); without
        # one, the launch settings say nothing and the header stays as it was.
        launch_only = ("startup_timeout_s", "stop_grace_s", "agent")
        for name in ("launch", "launch_env", "launch_unset_env", *launch_only):
            if name not in launch_only or self.launch is None:
                d.pop(name, None)
        return {
            k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in d.items()
        }


def option_doc(name: str) -> OptionDoc | None:
    """The command-line flag and help of the `SoakConfig` field `name` (None: not an option)."""
    for f in fields(SoakConfig):
        if f.name == name:
            doc = f.metadata.get("option")
            return doc if isinstance(doc, OptionDoc) else None
    raise KeyError(name)


def _finite(option: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{option} {value}: give a finite number")


def _seconds(option: str, value: float, *, zero_ok: bool = False) -> None:
    _finite(option, value)
    if value < 0 or (value == 0 and not zero_ok):
        raise InputError(
            f"{option} {value:g}: must be {'0 or more' if zero_ok else 'more than 0'} seconds"
        )
    if value > MAX_SECONDS:
        raise InputError(f"{option} {value:g}: more than 30 days; give seconds")


def _int_range(option: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise InputError(f"{option} {value}: must be between {lo} and {hi}")
