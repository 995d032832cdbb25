"""profilers: cut-point discovery, per-cut FLOPs/sizes, measured per-block time, and gradient
statistics (docs/architecture.md). Imports are lazy so that ``import profilers`` does not load torch.

Public API::

    build_chain(model, example_input) -> Chain
    profile_model(model, input_shape, model_name=None, bits_per_value=32, measure_time=False, ...) -> ModelProfile
    estimate_constants(chain_or_model, batches, loss_fn=cross_entropy, gamma=0.01, epsilon=0.1, num_batches=8, ...)
        -> ConvergenceConstants
    measure_block_times(blocks, input_shape, batch_size=16, repeats=5, ...) -> BlockTimes
"""

from __future__ import annotations

from adaptplan.lazy import lazy_getattr

_LAZY = {
    "Chain": "profilers.chain",
    "build_chain": "profilers.chain",
    "profile_model": "profilers.profile",
    "estimate_constants": "profilers.gradstats",
    "measure_block_times": "profilers.timing",
    "BlockTimes": "profilers.timing",
    "resolve_model": "profilers.models",
}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr('profilers', _LAZY)
