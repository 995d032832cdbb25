"""The run's model and engine, and a change of model during the run: one part of
:class:`trainers.run.driver.Trainer` (its base class). The run cuts its model into blocks and profiles them
(``_use_model``), builds the runtime's engine over them (``_make_engine``), and where its strategy moves to another
model after a round (``model_change_round``: FedConcat's second stage, docs/engine.md "A change of model") builds that
model, its profile and clock and every role anew around it, the simulated seconds and the strategy's generator
going on (``_follow_model``).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemProcess
from profilers import build_chain, profile_model
from profilers.chain import Chain
from profilers.profile import StemWarning
from trainers.api import Strategy
from trainers.config.train_config import TrainConfig
from trainers.engine.clock import SimClock
from trainers.engine.execution import Execution
from trainers.engine.split_engine import DeviceData, SplitEngine
from trainers.inputs.datasets import Dataset
from trainers.roles.defences import ActivationDefence
from trainers.run.history import History


class RunModel:
    """The model and engine of a run (the attributes below are the Trainer's)."""

    config: TrainConfig
    strategy: Strategy
    dataset: Dataset
    device: torch.device
    engine_factory: Callable[..., SplitEngine]
    engine: SplitEngine
    clock: SimClock
    process: SystemProcess
    history: History
    blocks: torch.nn.Sequential
    block_names: list[str]
    profile: ModelProfile
    base_blocks: torch.nn.Sequential
    model_stage: int

    def _make_engine(self, cuts: list[int], interval: int, data: DeviceData) -> SplitEngine:
        """The runtime's engine over ``self.blocks`` and ``self.clock`` with the run's settings."""
        c = self.config
        return self.engine_factory(self.blocks, cuts, self.strategy, data, c.optimizer_spec("client"), c.data.batch_size,
                                   seed=c.run.seed, interval=interval, clock=self.clock, total_rounds=c.run.rounds,
                                   server_optimizer=c.optimizer_spec("server"),
                                   aggregation=(c.optim.aggregation, c.optim.trim), defence=ActivationDefence.of(c.privacy),
                                   execution=Execution.resolve(self.device, c.execution.client_batching,
                                                               c.execution.server_pass_samples,
                                                               c.execution.client_recompute, c.execution.batch_devices))

    def _follow_model(self, t: int) -> None:
        """Where the strategy moved to another model after round ``t`` (``model_stage``: FedConcat's second stage),
        build it, its profile and clock (the simulated seconds go on) and every role anew around it, every device
        holding all of it, the strategy's generator going on; the history records the change."""
        self.strategy.end_of_round(self.engine.context(t), self.engine)
        if self.strategy.model_stage != self.model_stage:
            self._rebuild_for_model()
            self.history.events.append({"round": t, "event": "model", "stage": self.model_stage,
                                        "num_blocks": len(self.blocks), "block_names": self.block_names})

    def _rebuild_for_model(self) -> None:
        """Build the strategy's model of its ``model_stage`` and every role anew around it (:meth:`_follow_model`)."""
        self._use_model(self.strategy.model_for(self.base_blocks))
        old, seconds = self.engine, self.clock.seconds
        self.clock = SimClock(self.profile, self.process, self.config.data.batch_size)
        self.clock.seconds = seconds
        self.engine = self._make_engine([len(self.blocks)] * old.num_devices, old.interval, old.data)
        self.engine.rng.bit_generator.state = old.rng.bit_generator.state
        self.model_stage = self.strategy.model_stage

    def _use_model(self, model: torch.nn.Module) -> Chain:
        """Cut ``model`` into blocks (``self.blocks``, ``self.block_names``) and profile them; the chain."""
        c = self.config
        input_shape = tuple(int(s) for s in self.dataset.x_train.shape[1:])
        chain = build_chain(model, self.dataset.x_train[:2])
        self.blocks, self.block_names = chain.blocks, list(chain.names)
        with warnings.catch_warnings():   # said once, by name, in self.notes
            warnings.simplefilter("ignore", StemWarning)
            profile = profile_model(chain, input_shape, model_name=f"{c.model.name}-{c.data.dataset}")
        self.profile = ActivationDefence.of(c.privacy).charged(profile, c.data.batch_size)    # its FLOPs, eqs. (16), (21)
        return chain

