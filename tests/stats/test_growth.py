"""The growth model (vramdoctor.stats.growth) on the shapes memory really takes.

Each shape is built the way the layer behaves: a leak adds the same for the same work; a
cache filling from a finite pool of items adds a shrinking share each round (the share of
new items falls geometrically); an allocator that grabs one more segment once steps; a cache
trimmed now and then breathes; jitter is noise. The calibration test draws thousands of such
series with measured noise and counts the two costly errors: a leak called caching, a
converging cache called a leak.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from vramdoctor.stats.growth import Model, fit_growth, halving_ratio, level_noise
from vramdoctor.verdicts import Reason, Verdict

X = [0.0, 50.0, 100.0, 150.0, 200.0, 250.0]


def test_a_steady_leak_is_steady_with_its_exact_rate() -> None:
    fit = fit_growth(X[:4], [0.0, 25.0, 50.0, 75.0], floor=2.0)
    assert fit.model is Model.STEADY and fit.verdict is Verdict.LEAK
    assert fit.reason is Reason.GREW_EVERY_ROUND
    assert fit.rate == pytest.approx(0.5) and fit.rate_ci is not None
    assert fit.rate_ci[0] <= 0.5 <= fit.rate_ci[1]


def test_growth_that_halves_every_round_converges_to_its_bound() -> None:
    # A GPU cache: +320, +160, +80, ... bounded at +640 MiB.
    levels = [640.0 * (1 - 0.5**k) for k in range(1, 7)]
    fit = fit_growth(X, levels, floor=2.0)
    assert fit.model is Model.CONVERGING and fit.verdict is Verdict.CACHING
    assert fit.ratio == pytest.approx(0.5, abs=0.02)
    assert fit.bound == pytest.approx(640.0, rel=0.01)


def test_a_multimodal_cache_filling_towards_its_cap_is_caching_with_a_bound() -> None:
    # A multimodal host cache: +254, +140, +77, +44, +25 MiB a round.
    levels = np.cumsum([254.0, 140.0, 77.0, 44.0, 25.0])
    fit = fit_growth(X[:5], levels, floor=2.0)
    assert fit.verdict is Verdict.CACHING and fit.reason is Reason.CONVERGING
    assert fit.bound is not None and levels[-1] < fit.bound < levels[-1] + 60.0


def test_a_leak_that_loses_a_percent_a_round_is_still_a_leak() -> None:
    # 2.398, 2.391, 2.375 MiB a round (a red-team server keeping 300 KiB/request): the decay
    # is significant and negligible; a cache would need hundreds of rounds to level off.
    levels = np.cumsum([24.5, 2.398, 2.391, 2.375])
    fit = fit_growth([8.0, 16.0, 24.0, 32.0], levels, noise=0.001, floor=2.0)
    assert fit.verdict is Verdict.LEAK


def test_a_step_then_flat_is_caching_and_a_staircase_is_not() -> None:
    step = fit_growth(X[:5], [140.0, 140.0, 230.0, 230.0, 230.0], floor=2.0)
    assert step.verdict is Verdict.CACHING and step.reason is Reason.ROSE_THEN_FLAT
    stairs = fit_growth(
        [50.0 * i for i in range(7)], [50.0, 50.0, 100.0, 100.0, 150.0, 150.0, 200.0], floor=2.0
    )
    assert stairs.verdict in (Verdict.LEAK, Verdict.INCONCLUSIVE)


def test_memory_that_breathes_or_falls_back_is_caching() -> None:
    breathe = fit_growth([50.0 * i for i in range(7)], [60, 40, 60, 40, 60, 40, 60], floor=2.0)
    assert breathe.verdict is Verdict.CACHING and breathe.model is Model.BOUNDED
    fell = fit_growth(X[:4], [1040.0, 1040.0, 1040.0, 996.0], floor=2.0)
    assert fell.verdict is Verdict.CACHING and fell.reason is Reason.FELL_BACK


def test_flat_short_and_broken_input() -> None:
    assert fit_growth(X[:4], [10.0, 10.5, 9.8, 10.2], floor=2.0).verdict is Verdict.STABLE
    assert fit_growth([], [], floor=1.0).reason is Reason.NO_LEVEL
    two = fit_growth([0.0, 50.0], [0.0, 30.0], floor=2.0)
    assert two.verdict is Verdict.INCONCLUSIVE and two.reason is Reason.TOO_FEW_ROUNDS
    nan = fit_growth([0.0, 50.0, math.nan, 100.0, 150.0], [0.0, 25.0, 7.0, 50.0, 75.0], floor=2.0)
    assert nan.n == 4 and nan.verdict is Verdict.LEAK
    same_x = fit_growth([5.0, 5.0, 5.0], [1.0, 9.0, 30.0], floor=2.0)
    assert same_x.verdict is Verdict.INCONCLUSIVE


def test_undecided_growth_says_how_many_more_rounds_would_decide() -> None:
    rng = np.random.default_rng(2)
    levels = 10.0 * np.arange(4) + rng.normal(0, 1.5, 4)
    fit = fit_growth(X[:4], levels, noise=1.5, floor=2.0)
    assert fit.verdict is Verdict.INCONCLUSIVE and fit.reason is Reason.STEADY_OR_CONVERGING
    assert fit.steps_to_decide is not None and 1 <= fit.steps_to_decide <= 12
    more = 10.0 * np.arange(4 + fit.steps_to_decide + 2) + rng.normal(
        0, 1.5, 6 + fit.steps_to_decide
    )
    assert fit_growth([50.0 * i for i in range(len(more))], more, noise=1.5, floor=2.0).verdict is (
        Verdict.LEAK
    )


def test_halving_ratio_and_level_noise() -> None:
    # A leak must rule out every cache that would halve its growth within five rounds (or
    # within the rounds observed, up to eight).
    assert halving_ratio(2) == halving_ratio(5) == pytest.approx(0.5**0.25)
    assert halving_ratio(7) == pytest.approx(0.5 ** (1 / 6))
    assert halving_ratio(30) == halving_ratio(8)
    assert level_noise([[5.0]]) == 0.0
    assert level_noise([[5.0]], resolution=1.0) == pytest.approx(1 / math.sqrt(12))
    assert level_noise([[0.0, 1.0, 0.0, 1.0, 0.0, 1.0]] * 3) > 0.3


def _draw(rng: np.random.Generator, rounds: int, r: float, rel: float) -> np.ndarray:
    incs = 10.0 * r ** np.arange(rounds - 1)
    return np.concatenate([[0.0], np.cumsum(incs)]) + rng.normal(0, 10.0 * rel, rounds)


def test_calibration_no_leak_called_caching_and_no_cache_called_a_leak() -> None:
    """Seeded draws with the level noise measured right: 0 of 1,680 leaks called CACHING,
    0 of 3,360 caches converging at r <= 0.8 called LEAK; and power grows with rounds."""
    rng = np.random.default_rng(20261201)
    n = 35
    false_caching = false_leak = 0
    found: dict[int, int] = {}
    for rounds in (4, 6, 8, 12):
        x = [50.0 * i for i in range(rounds)]
        for rel in (0.02, 0.1, 0.2, 0.4):
            for _ in range(n * 3):
                fit = fit_growth(x, _draw(rng, rounds, 1.0, rel), noise=10.0 * rel, floor=2.0)
                false_caching += fit.verdict is Verdict.CACHING
                if rel == 0.1:
                    found[rounds] = found.get(rounds, 0) + (fit.verdict is Verdict.LEAK)
            for r in (0.3, 0.5, 0.7, 0.8):
                for _ in range(n * 3 // 2):
                    y = _draw(rng, rounds, r, rel)
                    fit = fit_growth(x, y, noise=10.0 * rel, floor=2.0)
                    false_leak += fit.verdict is Verdict.LEAK
    assert false_caching == 0 and false_leak == 0
    assert found[12] >= found[8] >= 0.9 * n * 3 and found[4] < found[6]


def test_a_cache_that_steps_up_twice_and_stays_is_caching_with_its_level() -> None:
    # Fleet's shape: hourly floors over 6 days, +1536 MiB at a third, +1024 MiB at 58 %,
    # then flat for 60 hours. One nested family cannot hold two steps; the change point can.
    rng = np.random.default_rng(0)
    x = np.arange(144) * 3600.0
    y = np.where(x >= 0.33 * x[-1], 1536.0, 0.0) + np.where(x >= 0.58 * x[-1], 1024.0, 0.0)
    fit = fit_growth(x, y + rng.normal(0, 3, 144), floor=32.0, step=3600.0, x_unit="s")
    assert fit.verdict is Verdict.CACHING and fit.reason is Reason.ROSE_THEN_FLAT
    assert fit.bound == pytest.approx(2560.0, rel=0.05)
    assert fit.change_at is not None and 0.55 * x[-1] <= fit.change_at <= 0.75 * x[-1]


def test_a_leak_that_starts_late_is_a_leak_at_its_rate_since_then() -> None:
    # Flat for two thirds of the window, then 191 MiB an hour: the rate is the recent one.
    rng = np.random.default_rng(1)
    x = np.arange(144) * 3600.0
    start = 0.66 * x[-1]
    y = np.where(x >= start, (x - start) * 191.0 / 3600.0, 0.0) + rng.normal(0, 3, 144)
    fit = fit_growth(x, y, floor=32.0, step=3600.0, x_unit="s")
    assert fit.verdict is Verdict.LEAK and fit.rate is not None
    assert fit.rate * 3600.0 == pytest.approx(191.0, rel=0.05)
    assert fit.change_at is not None and abs(fit.change_at - start) < 0.05 * x[-1]
    # and a leak from the start has no change point
    steady = fit_growth(x, x * 50.0 / 3600.0 + rng.normal(0, 20, 144), floor=32.0, step=3600.0)
    assert steady.verdict is Verdict.LEAK and steady.change_at is None


def test_a_leak_under_a_cache_that_filled_is_found_at_the_leaks_own_rate() -> None:
    # Written independently of the model: a cache that filled in the
    # first rounds, then a 64 KiB/request leak, 40 requests a round; glibc's bytes in use as the
    # agent read them (MiB). The converging model alone said "cannot yet tell" after ten rounds.
    y = [26.27, 38.85, 41.35, 43.86, 46.36, 48.86, 51.36, 53.86, 56.36, 58.86]
    fit = fit_growth([40.0 * i for i in range(1, 11)], y, noise=0.07, floor=2.0, step=40.0)
    assert fit.model is Model.STEADY and fit.verdict is Verdict.LEAK
    assert fit.rate == pytest.approx(2.5 / 40.0, rel=0.01)
    assert fit.change_at == pytest.approx(80.0)
    # The same fill with nothing after it is a cache that filled.
    flat_after = [26.27, 38.85, 41.35] + [41.35] * 7
    fit = fit_growth([40.0 * i for i in range(1, 11)], flat_after, noise=0.07, floor=2.0, step=40.0)
    assert fit.verdict is Verdict.CACHING


def test_growth_that_stops_shrinking_is_not_called_converging() -> None:
    # +12, +12, +12, +7, +3, +3 MiB a round (H200, the reference host-leak server): the last
    # step adds as much as the one before: not converging; one more round decides.
    y = [361.2, 373.2, 385.2, 397.2, 404.2, 407.2, 410.2]
    fit = fit_growth([12.0 * i for i in range(1, 8)], y, noise=0.07, floor=2.0, step=12.0)
    assert fit.verdict is Verdict.INCONCLUSIVE and fit.reason is Reason.STEADY_OR_CONVERGING
    fit = fit_growth([12.0 * i for i in range(1, 9)], [*y, 413.2], noise=0.07, floor=2.0, step=12.0)
    assert fit.verdict is Verdict.LEAK and fit.rate == pytest.approx(0.25, rel=0.01)
