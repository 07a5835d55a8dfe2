"""Lifecycle endpoints (sleep/wake, release/resume memory occupation, LoRA load/unload).

Filled in by the lifecycle work; until then no route is served and every request is accepted.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from refserver.request import Request
    from refserver.state import State


class Lifecycle:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """The lifecycle flags (none yet)."""

    def attach(self, state: State) -> None:
        self.state = state

    def route(
        self, method: str, path: str, query: dict[str, list[str]], raw: bytes
    ) -> tuple[int, Any] | None:
        return None

    def server_args(self) -> dict[str, Any]:
        return {}

    def model_cards(self) -> list[dict[str, Any]]:
        return []

    def adapter_names(self) -> set[str]:
        return set()

    def refuse_request(self, req: Request) -> tuple[int, Any] | None:
        return None
