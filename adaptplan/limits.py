"""The documented limits on what adaptplan accepts (README "Input limits").

Generic number limits (finite, |x| ≤ 10³⁰, positive values ≥ 10⁻³⁰, file size and nesting) live in
:mod:`adaptplan.fileio`; these are the per-quantity ones. They keep every command bounded in time
and memory and every result representable: a plan with more than :data:`MAX_ROUNDS` rounds is
refused rather than printed with hundreds of digits.
"""

from __future__ import annotations

MAX_DEVICES = 10_000            # edge devices N in a system (file, generator, training)
MAX_BATCH_SIZE = 1_000_000      # samples per device per round
MAX_CUT_POINTS = 10_000         # cut points L of a profile
MAX_ROUNDS = 10**12             # training rounds of a plan (and its interval)
MAX_BITS_PER_VALUE = 64         # bits per activation/gradient/parameter value
MAX_INPUT_VALUES = 2**24        # values per input sample (C·H·W) that `profile` will allocate
MAX_NUM_CLASSES = 100_000       # output classes of a model
MAX_SEED = 2**32 - 1            # seeds are 0..2³²−1
MAX_THREADS = 1024              # torch CPU threads
MAX_STEPS = 10**9               # rounds of a training run, evaluation/checkpoint/re-plan periods
MAX_NOISE_CV = 1.0              # measurement-noise coefficient of variation (a fraction)
MAX_MODEL_WIDTH = 4096      # channels of the built-ins' first layer (--model-width)
