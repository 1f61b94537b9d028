"""What a dashboard view is, and the views the page shows.

A view is one tab of ``/dashboard``. It has two halves:

- a server half, this protocol: JSON under its own route prefix (``/v1/tuning/`` for
  the tuning view) and a cheap ``version()`` that changes whenever its data does (the
  event stream, ``/dashboard/events``, tells the page which views changed);
- a client half: one static script (``static/<name>.js``) that registers the tab with
  ``FS.register({...})`` (see ``static/core.js``).

Adding a view is a new module here with a class like
:class:`~fleetserve.dashboard.tuning.TuningView`, a ``static/<name>.js`` and one line in
:func:`default_views`; nothing else changes. The fleet view (``fleet.py``) is one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..bench.tune.runs import RunStore
from ..settings import Settings
from .added import AddedView
from .fleet import FleetView
from .tuning import TuningView


class View(Protocol):
    """The server half of a dashboard tab."""

    #: the tab's id: the client registers the same name, change events carry it
    name: str
    #: its data routes: every path under it is answered by :meth:`data`
    prefix: str
    #: its client script, a file in ``dashboard/static/``
    script: str

    async def version(self) -> str:
        """A token that changes whenever the data changes. Called every tick of every
        open event stream (memoized across streams), so it must be cheap and must not
        raise."""
        ...

    async def data(self, subpath: str) -> object:
        """The JSON body for ``prefix + subpath`` (a GET). Raises a ``FleetError``
        (``NotFound`` naming what is missing) when there is nothing to show."""
        ...


def default_views(settings: Settings) -> list[View]:
    """The views of a server with ``settings``, in tab order."""
    tune_dir = Path(settings.tune_dir).expanduser()
    # the fleet first: the page opens on what serves now (tuning runs may be none yet)
    return [FleetView(), TuningView(RunStore(tune_dir)), AddedView(tune_dir / "reports")]


__all__ = ["View", "default_views"]
