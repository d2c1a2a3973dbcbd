"""What runs inside every Dask worker process: the preload with the preemption drain hooks."""
