"""Benchmarks of the appliance; run each from the repository root as ``python -m bench.NAME``.

They report and never assert a time: a benchmark exits 1 only when what it
checks (the table holds exactly what was acknowledged, the server exited 0)
fails. What they share is in :mod:`bench.harness`; the results and their
reading are in ``bench/RESULTS.md``.
"""
