"""Pure analysis over recorded samples: no I/O, no clocks, no printing."""
