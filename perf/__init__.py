"""shmq benchmarks: ``python -m perf [--quick] [name ...]``; see perf/__main__.py."""
