"""Growth statistics shared by soak, watch and fleet: pure functions over numbers.

ONE growth model (`vramdoctor.stats.growth`) tells apart, for one memory series:

- steady growth per unit of work (a leak: the same amount for the same requests),
- steady growth in time (a leak driven by a clock: it grows inside idle windows too),
- converging growth (a cache filling towards its cap: each step adds a shrinking share; the
  projected bound is given),
- a step (it rose once and stays), memory that fell back or breathes within a band (caching),
- noise, and growth whose shape the points cannot name yet (undecided: how many more steps
  would decide).

The model selection rule is documented in `vramdoctor.stats.growth` (and docs/soak.md, "The
growth model"). Verdicts and reason codes are `vramdoctor.verdicts`.

Public API (import from the modules; each imports scipy only when it computes):

    from vramdoctor.stats.growth import fit_growth, GrowthFit, Model, level_noise

    fit = fit_growth(x, y, noise=0.4, floor=2.0, step=50, x_unit="request")
    fit.model          # Model.STEADY / CONVERGING / STEP / FALLING / BOUNDED / NOISY / FLAT /
                       # UNDECIDED
    fit.verdict        # vramdoctor.verdicts.Verdict: LEAK, CACHING, STABLE, INCONCLUSIVE
    fit.reason         # vramdoctor.verdicts.Reason: grew_every_round, converging, ...
    fit.rate, fit.rate_ci        # the steady slope per unit of x and its 90 % interval
    fit.ratio, fit.ratio_ci      # share of a step's growth the next step adds (1 = steady)
    fit.bound, fit.bound_hi      # converging: the projected level (and at the slowest
                                 # convergence allowed)
    fit.steps_to_decide          # undecided: about how many more steps would decide
    fit.to_dict()                # JSON-ready

  `x`: work done (cumulative requests; or seconds, with x_unit="s"), `y`: levels in the
  series' unit (MiB, tokens), `noise`: one level's noise as the caller measured it (0 =
  unknown: the residuals say it), `floor`: the smallest change that counts, `step`: the x of
  one normal step (one round's requests, one envelope block's seconds). Points where the
  server did comparable work only (settled after an idle window; a low envelope).

    from vramdoctor.stats.rounds import classify_series, time_driven, time_growth

  soak's rounds: settled levels + cumulative requests + the samples behind each level ->
  `SeriesFit` (round 1 is warm-up; the growth model from there), and growth inside idle
  windows (`time_growth`: a pooled within-window slope with its interval; `time_driven`: the
  rate per second when it explains the settled levels' growth).

    from vramdoctor.stats.trend import classify, low_envelope, low_envelope_arrays

  the older trend test of watch and fleet (Theil-Sen + Kendall over comparable points): kept
  working unchanged until watch and fleet move to `fit_growth`; `low_envelope*` (the level
  at the quietest moment of each block) stays the way to choose comparable points from a
  busy series.
"""

# A namespace of modules: import what you need from them (e.g. vramdoctor.stats.growth).
__all__: list[str] = []
