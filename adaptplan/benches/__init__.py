"""The benchmarks behind ``adaptplan bench``: the planner's solvers (:mod:`.solvers`), the engine's throughput and
memory (:mod:`.engine`), and the training comparisons — policies (:mod:`.training`), algorithms
(:mod:`.algorithms`) and the papers' claims from their recipe files (:mod:`.papers`, :mod:`.recipes`) — with the
one training setting a comparison shares (:mod:`.comparison`) and the worker processes that run them
(:mod:`.runs`). Part of the roof: they may import anything, nothing below imports them."""
