"""The scenario fleet (tests/fixtures/fleet/scenario.py) loaded into a real Prometheus and a
real VictoriaMetrics, once per test session; tests that take `engine` run against each.

Skipped only where a binary is absent (CI installs both: .ci/run)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fixtures.fleet.scenario import Scenario, scenario
from fleet_engines import APT, PROMETHEUS, PROMTOOL, VICTORIA, Engine, prometheus, victoriametrics

DAYS = 6.0
STEP_S = 120.0


@dataclass
class Loaded:
    engine: Engine
    scenario: Scenario

    @property
    def url(self) -> str:
        return self.engine.url

    @property
    def end(self) -> float:
        return self.scenario.end


@pytest.fixture(scope="session")
def fleet_scenario() -> Scenario:
    end = (time.time() // 3600) * 3600 - 600
    return scenario(end, DAYS, STEP_S)


@pytest.fixture(scope="session")
def prometheus_fleet(
    tmp_path_factory: pytest.TempPathFactory, fleet_scenario: Scenario
) -> Iterator[Loaded]:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip(f"needs prometheus and promtool ({APT})")
    with prometheus(tmp_path_factory.mktemp("prom-fleet"), fleet_scenario.series) as eng:
        yield Loaded(eng, fleet_scenario)


@pytest.fixture(scope="session")
def victoria_fleet(
    tmp_path_factory: pytest.TempPathFactory, fleet_scenario: Scenario
) -> Iterator[Loaded]:
    if VICTORIA is None:
        pytest.skip(f"needs victoria-metrics ({APT})")
    with victoriametrics(tmp_path_factory.mktemp("vm-fleet"), fleet_scenario.series) as eng:
        yield Loaded(eng, fleet_scenario)


@pytest.fixture(params=["prometheus", "victoriametrics"])
def engine(request: pytest.FixtureRequest) -> Loaded:
    """The scenario fleet in each engine in turn."""
    name = "prometheus_fleet" if request.param == "prometheus" else "victoria_fleet"
    loaded: Loaded = request.getfixturevalue(name)
    return loaded
