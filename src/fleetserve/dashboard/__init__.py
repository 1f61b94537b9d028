"""The web page at ``/dashboard``: tuning runs and the live fleet (one view each)."""

from .app import Dashboard
from .views import View, default_views

__all__ = ["Dashboard", "View", "default_views"]
