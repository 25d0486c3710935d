"""Benchmarks: kernels, mode switch, serving workloads and the open-loop client."""
