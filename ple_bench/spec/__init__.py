"""What to run: a suite's TOML file, its axes, their expansion into cases and the constraints that
drop some; ``case`` is one case, plain data."""
