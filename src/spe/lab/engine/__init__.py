"""The training engine every task runs on: the loop, its task interface, crash-safe state, run folders,
optimiser, distributed training, precision, metrics log."""
