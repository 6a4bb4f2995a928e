"""The dashboard's own objects, built once when the gateway starts and closed with it: the tier
memory history and its sampler, and the admin sessions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dashboard.history import TierHistory, sample_forever
from dashboard.sessions import Sessions
from gateway.services import Services
from gateway.settings import DashboardSettings


@dataclass
class Dashboard:
    settings: DashboardSettings
    history: TierHistory
    sessions: Sessions
    sampler: asyncio.Task[None] | None = None

    @classmethod
    def start(cls, services: Services) -> Dashboard:
        """Build the dashboard for ``services`` and start sampling tier memory (on the running loop)."""
        s = services.settings
        admin = s.auth.admin_key.get_secret_value() if s.auth.admin_key else None
        dash = cls(s.dashboard, TierHistory(s.dashboard.history), Sessions(admin, s.dashboard.session_ttl_s))
        sampler = sample_forever(dash.history, services.store.usage, s.dashboard.sample_interval_s)
        dash.sampler = asyncio.get_running_loop().create_task(sampler, name="dashboard-tier-sampler")
        return dash

    async def aclose(self) -> None:
        if self.sampler is not None:
            self.sampler.cancel()
            await asyncio.gather(self.sampler, return_exceptions=True)
