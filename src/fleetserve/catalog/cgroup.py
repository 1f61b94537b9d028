"""The memory limit of this process's own cgroup, v2 or v1, read from /proc and /sys.

``/proc/self/cgroup`` names the process's cgroup in each hierarchy: ``0::/path`` in the
v2 (unified) one, ``N:memory:/path`` (or ``N:cpu,memory:/path``) for the v1 memory
controller. The limit that binds is the smallest from that cgroup up to the mount's
root: ``memory.max`` in v2 (``max``: none), ``memory.limit_in_bytes`` in v1 (a huge
number: none). v2 is mounted at ``/sys/fs/cgroup``, or at ``/sys/fs/cgroup/unified``
beside v1 controllers (hybrid); v1's memory controller at ``/sys/fs/cgroup/memory``.

In a container the mount's root is the container's own cgroup, while the path may be
the host's name for it (``/docker/<id>``, without a cgroup namespace): a level that is
not under the mount is skipped, so the walk still ends at the container's limit.

Every path is under ``root`` (``/`` outside tests), so a test builds a fake tree.
"""

from __future__ import annotations

from pathlib import Path

V2_MOUNTS = ("sys/fs/cgroup", "sys/fs/cgroup/unified")
V1_MOUNT = "sys/fs/cgroup/memory"


def own_cgroups(root: Path = Path("/")) -> tuple[str, str]:
    """This process's v2 cgroup path and its v1 memory cgroup path, from
    ``/proc/self/cgroup``; "/" for one it does not list (or without the file)."""
    v2 = v1 = "/"
    try:
        text = (root / "proc/self/cgroup").read_text()
    except OSError:
        return v2, v1
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hier == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _smallest_on_the_way_up(mount: Path, path: str, name: str) -> int | None:
    """The smallest numeric ``name`` file in ``mount/path`` and each parent up to
    ``mount``; None if there is none (not mounted, or no limit anywhere)."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    best: int | None = None
    for depth in range(len(parts), -1, -1):
        try:
            raw = mount.joinpath(*parts[:depth], name).read_text().strip()
        except OSError:
            continue  # not under this mount (a host path seen from a container), or none
        if raw.isdigit():
            best = int(raw) if best is None else min(best, int(raw))
    return best


def cgroup_memory_limit(root: Path = Path("/")) -> int | None:
    """The memory limit of this process's cgroup in bytes (the smallest of v2 and v1
    where both are mounted); None if no cgroup sets one."""
    v2, v1 = own_cgroups(root)
    found = [_smallest_on_the_way_up(root / mount, v2, "memory.max") for mount in V2_MOUNTS] + [
        _smallest_on_the_way_up(root / V1_MOUNT, v1, "memory.limit_in_bytes")
    ]
    limits = [n for n in found if n is not None]
    return min(limits) if limits else None


__all__ = ["cgroup_memory_limit", "own_cgroups"]
