"""The benchmarks behind docs/benchmarks.md; run them with ``scripts/bench [SECTION...]``."""
