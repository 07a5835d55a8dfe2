"""Growth statistics shared by soak, watch and fleet: pure functions over numbers.

`rounds`: leak, caching or stable for one series from its settled level after each round
(Theil-Sen slope and Kendall trend over cumulative requests). `trend`: growth of one series over
comparable points in time (watch and fleet).
"""

# A namespace of modules: import what you need from them (e.g. vramdoctor.stats.trend).
__all__: list[str] = []
