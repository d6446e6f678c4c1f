"""Side-by-side speed benchmarks of dense_rnn against Flax, PyTorch and plain lax.scan ports.

Run ``python -m benchmarks.run`` (``--quick`` for a smoke run); see ``benchmarks/RESULTS.md``.
"""
