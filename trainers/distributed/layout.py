"""Which rank plays which role (docs/distributed.md).

Rank 0 is the edge server; it also runs the round loop (the strategy decides there, as in the
simulator) and writes the run folder. Rank 1 is the fed server. Ranks 2..W−1 host the devices,
device i on rank 2 + (i mod (W − 2)), so a rank hosts several devices when there are more devices
than device ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

EDGE_RANK = 0
FED_RANK = 1
FIRST_DEVICE_RANK = 2
SETUP_TIMEOUT_FACTOR = 10
"""Before round 1, ranks wait this many --rank-timeout for each other (data, profile, plan, first use of torch)."""
FED_ALLOWANCE = 1.0
"""--rank-timeouts rank 0 waits on the fed server beyond its own: the fed server waits on device ranks' uploads
itself (one time-out, which may start after rank 0's) and then reports the rank it waited on, so that rank 0 names
that device rank, not the fed server (issue 67 M5)."""


@dataclass(frozen=True)
class RankLayout:
    world_size: int
    num_devices: int

    def __post_init__(self) -> None:
        if self.world_size < 3:
            raise ValueError(f"a distributed run needs at least 3 ranks (edge, fed, one device host), got {self.world_size}")

    @property
    def device_ranks(self) -> list[int]:
        return list(range(FIRST_DEVICE_RANK, self.world_size))

    def rank_of(self, device: int) -> int:
        return FIRST_DEVICE_RANK + device % (self.world_size - FIRST_DEVICE_RANK)

    def devices_of(self, rank: int) -> list[int]:
        return [d for d in range(self.num_devices) if self.rank_of(d) == rank]

    def role(self, rank: int) -> str:
        if rank == EDGE_RANK:
            return "edge server"
        if rank == FED_RANK:
            return "fed server"
        devices = self.devices_of(rank)
        return f"device {devices[0]}" if len(devices) == 1 else f"devices {', '.join(map(str, devices))}"

    def describe(self, rank: int) -> str:
        return self.role(rank)


def default_world_size(num_devices: int, max_device_ranks: int = 8) -> int:
    """Edge + fed + one rank per device, at most ``max_device_ranks`` device ranks."""
    return FIRST_DEVICE_RANK + max(1, min(num_devices, max_device_ranks))
