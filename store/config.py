"""The store's one configuration record. The gateway builds it from its settings; each component
copies the fields it uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30


@dataclass(frozen=True)
class StoreConfig:
    data_dir: Path  # the SSD tier and the embedded Redis live under it
    redis_url: str | None = None  # None: start the embedded redis-server under data_dir
    node: str = "local"  # one store per node; Redis keys are scoped by it
    key_prefix: str = "hf"
    page_size: int = 16
    device_budget: int = 0  # bytes per engine device cache; also capped by what the engine reports
    cpu_budget: int = 2 * GiB
    ssd_budget: int = 16 * GiB
    high_water: float = 0.95  # oom.alert when a tier's usage crosses this fraction of its budget
    ttl_s: int = 7 * 24 * 3600  # every key expires unless touched within this time
    events_maxlen: int = 10_000  # approximate length the events stream is trimmed to
    connect_timeout_s: float = 0.25
    socket_timeout_s: float = 0.5
    node_lease_s: float = 15.0  # the node's lease in Redis lapses this long after its holder died
    ssd_fsync: bool = False  # rename already hides partial files from a crash; fsync guards power loss

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))  # a str from a settings file
        if self.page_size < 1:
            raise ValueError(f"page_size must be positive, got {self.page_size}")
        for name in ("device_budget", "cpu_budget", "ssd_budget"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not 0.0 < self.high_water <= 1.0:
            raise ValueError(f"high_water must be within (0, 1], got {self.high_water}")
        if self.ttl_s < 1 or self.events_maxlen < 1:
            raise ValueError("ttl_s and events_maxlen must be positive")
        if self.node_lease_s <= 0:
            raise ValueError(f"node_lease_s must be positive, got {self.node_lease_s}")
        if self.connect_timeout_s <= 0 or self.socket_timeout_s <= 0:
            raise ValueError("Redis timeouts must be positive")
