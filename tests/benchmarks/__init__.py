"""Tests of the lab (`benchmarks/`, run from a clone): the load test, the store benchmark, the
deflate-threshold study."""
