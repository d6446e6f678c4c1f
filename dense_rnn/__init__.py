"""Densely connected recurrent networks in JAX/Flax.

The modules build on each other: ``cells`` (pure-function cells) → ``recurrent`` (scanned
layers, bidirectional, masks) → ``stack`` / ``dense_block`` / ``hm_stack`` / ``hornn``
(connectivity) → ``models`` (Flax models of the four papers) → ``train`` (loops,
checkpoints, metrics). Import the submodule you need, e.g.
``from dense_rnn.models import LanguageModel``.
"""

__version__ = "0.1.0"
