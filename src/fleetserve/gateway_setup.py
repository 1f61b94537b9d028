"""The gateway's dashboard, for ``fleetserve serve`` and ``fleetserve gateway``.

Built by the process and passed into its Gateway (``gateway.wiring.Pages``): the
dashboard reuses the gateway's HTTP helpers, so the gateway does not build it.
"""

from __future__ import annotations

from .dashboard import Dashboard
from .gateway.auth import Authenticator
from .gateway.http import Scope
from .settings import Settings
from .wire import Scope as KeyScope


def build_dashboard(settings: Settings, auth: Authenticator) -> Dashboard:
    """With keys, the dashboard's data and events need a valid key with ``admin``."""

    def authorize(scope: Scope) -> None:
        auth.authorize(scope, KeyScope.ADMIN)

    return Dashboard.from_settings(settings, authorize=None if auth.is_open else authorize)
