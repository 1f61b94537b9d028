"""``fleetserve tune``: search runtimes, precisions and batch budgets behind quality
gates, measure through the real path, find the knee, and write a profile."""
