"""A training run: the driver, its run folder, checkpoints, history, plots and planning policies."""
