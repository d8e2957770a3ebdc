"""The benchmarks' helpers (bench/): peers and datasets (`peers`), summary tables (`summary`), and the child processes and data of single benchmarks."""
