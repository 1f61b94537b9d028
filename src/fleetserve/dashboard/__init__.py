"""The web page at ``/dashboard``: tuning runs now, fleet state later (one view each)."""

from .app import Dashboard
from .views import View, default_views

__all__ = ["Dashboard", "View", "default_views"]
