"""Fleet memory: a budget per device, and the models held within it."""
