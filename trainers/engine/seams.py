"""What the engine's parts see of the engine: :class:`EngineParts`, the typed seam between the
:class:`~trainers.engine.split_engine.SplitEngine` facade and the modules that do its work (the synchronous round,
the asynchronous loop, aggregation, re-partitioning, the models' views, checkpoint state).

The facade passes itself to each part; the part reads and writes the engine only through the attributes and methods
declared here, so mypy checks every access at the seam (the facade conforms structurally: it is passed where an
:class:`EngineParts` is asked). What a round takes and moves — each role's
seconds per stage, when the edge server is free, bytes per link and training samples — is one
:class:`~trainers.engine.round_data.RoundTimeline` the facade starts at each round and the parts add to.

Imports nothing of the engine at run time (the facade imports the parts, which import this module); the types
below are for the type checker only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch
    from torch import nn

    from trainers.api import RoundContext, Strategy
    from trainers.engine.clock import SimClock, StageTimes
    from trainers.engine.execution import Execution
    from trainers.engine.network import Network
    from trainers.engine.round_data import AsyncLoopState, DeviceData, RoundStats, RoundTimeline
    from trainers.roles.checks import Schema
    from trainers.roles.core import EdgeServer
    from trainers.roles.defences import ActivationDefence
    from trainers.roles.passes import EdgePasses


class EngineParts(Protocol):
    """The engine as its parts see it (module docstring). Attributes the parts write are marked so."""

    # ---- the run's fixed make-up
    template: nn.Sequential
    num_blocks: int
    num_devices: int
    num_classes: int
    batch_size: int
    block_bytes: list[int]
    block_values: list[int]
    upload_schema: Schema
    aggregation: tuple[str, float]
    strategy: Strategy
    data: DeviceData
    device: torch.device
    execution: Execution
    clock: SimClock | None
    net: Network
    edge: EdgeServer
    passes: EdgePasses                   # the edge server's passes, as the strategy is handed them
    rng: np.random.Generator
    defence: ActivationDefence           # what every device does to its activations (trainers/roles/defences.py)

    # ---- state the parts change (checkpointed by trainers.engine.state)
    cuts: list[int]                      # written by re-partitioning and a restore
    interval: int
    rounds_since_aggregation: int
    absent: set[int]
    stale: set[int]
    period: list[int] | None
    global_sizes: dict[int, int]
    async_state: AsyncLoopState | None
    awaiting: set[int]                   # devices whose activation is not answered yet
    timeline: RoundTimeline              # the running round's stage seconds, server free time, bytes and samples

    # ---- what the facade answers
    @property
    def may_stream(self) -> bool: ...

    def check_cuts(self, cuts: Sequence[int]) -> list[int]: ...

    def data_sizes(self) -> list[int]: ...

    def context(self, round_index: int) -> RoundContext: ...

    def present(self, devices: Sequence[int] | None = None) -> list[int]: ...

    def stage_times(self, round_index: int) -> StageTimes: ...

    def recompute(self, batch: Mapping[int, int]) -> bool: ...

    def blocks_bytes(self, blocks: Sequence[int]) -> int: ...

    def next_key(self) -> int: ...

    @property
    def fresh_client_state(self) -> bool: ...           # a device loading the global model restarts its optimizer state

    def load_global(self, device: int, round_index: int, fresh_optimizer: bool) -> int: ...

    def check_models_finite(self, round_index: int) -> None: ...

    def round_stats(self, ctx: RoundContext, aggregated: bool, participants: list[int], seconds: float) -> RoundStats: ...
