"""The memory limit of the process's own cgroup, v2 and v1, on fake /proc and /sys trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.catalog.cgroup import cgroup_memory_limit, own_cgroups
from fleetserve.catalog.hardware import memory_source
from fleetserve.fleet.memory import DEFAULT_FRACTION, default_budget

GIB = 2**30
V1_NONE = "9223372036854771712"  # what v1 reads where no limit is set
RAM = "MemTotal:       24641536 kB\n"  # 23.5 GiB


def tree(root: Path, self_cgroup: str | None, files: dict[str, str]) -> Path:
    """A fake root: /proc/meminfo, /proc/self/cgroup (unless None) and ``files``."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(RAM)
    if self_cgroup is not None:
        (root / "proc/self/cgroup").write_text(self_cgroup)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    return root


def test_v1_reads_the_process_own_memory_cgroup_not_the_root(tmp_path: Path) -> None:
    """The reported worker: cgroup v1, in a 3 GiB cgroup under an unlimited root. Today's
    code read only the root's memory.limit_in_bytes and took 70 % of host RAM."""
    v1 = "sys/fs/cgroup/memory"
    root = tree(
        tmp_path,
        "9:name=systemd:/\n4:memory:/process_api/w1\n1:cpu:/\n0::/\n",
        {
            f"{v1}/memory.limit_in_bytes": V1_NONE,
            f"{v1}/process_api/memory.limit_in_bytes": V1_NONE,
            f"{v1}/process_api/w1/memory.limit_in_bytes": str(3 * GIB),
            f"{v1}/process_api/other/memory.limit_in_bytes": str(1 * GIB),  # a sibling's
            "sys/fs/cgroup/unified/cgroup.procs": "",  # hybrid: v2 without memory
        },
    )
    assert own_cgroups(root) == ("/", "/process_api/w1")
    assert memory_source(root) == (3 * GIB, "cgroup")
    n, why = default_budget("cpu", root=root)
    assert n == int(3 * GIB * DEFAULT_FRACTION)
    assert why == "70% of the cgroup limit (3.0 GiB)"


def test_v2_takes_the_smallest_limit_from_the_process_cgroup_up(tmp_path: Path) -> None:
    """v2: the pod's 3 GiB binds the container below it (max); today's code read only
    /sys/fs/cgroup/memory.max, which the root cgroup does not have."""
    v2 = "sys/fs/cgroup"
    root = tree(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        {
            f"{v2}/kubepods/memory.max": "max",
            f"{v2}/kubepods/pod1/memory.max": str(3 * GIB),
            f"{v2}/kubepods/pod1/ctr/memory.max": "max",
            f"{v2}/kubepods/pod2/memory.max": str(1 * GIB),  # another pod's
        },
    )
    assert own_cgroups(root) == ("/kubepods/pod1/ctr", "/")
    assert cgroup_memory_limit(root) == 3 * GIB
    assert memory_source(root) == (3 * GIB, "cgroup")


def test_a_child_limit_below_its_parents_is_the_one_that_binds(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        "0::/a/b\n",
        {"sys/fs/cgroup/a/memory.max": str(8 * GIB), "sys/fs/cgroup/a/b/memory.max": "2147483648"},
    )
    assert cgroup_memory_limit(root) == 2 * GIB


@pytest.mark.parametrize(
    ("self_cgroup", "limit_file"),
    [
        ("0::/system.slice/docker-abc.scope\n", "sys/fs/cgroup/memory.max"),
        ("5:memory:/docker/abc\n0::/\n", "sys/fs/cgroup/memory/memory.limit_in_bytes"),
    ],
)
def test_in_a_container_the_host_path_falls_back_to_the_mount_root(
    tmp_path: Path, self_cgroup: str, limit_file: str
) -> None:
    """Without a cgroup namespace the path is the host's, not under the container's
    mount: the walk skips it and reads the container's limit at the mount's root."""
    root = tree(tmp_path, self_cgroup, {limit_file: str(2 * GIB)})
    assert memory_source(root) == (2 * GIB, "cgroup")


def test_no_limit_anywhere_is_physical_ram(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        "4:memory:/u\n0::/u\n",
        {
            "sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NONE,
            "sys/fs/cgroup/memory/u/memory.limit_in_bytes": V1_NONE,
            "sys/fs/cgroup/unified/u/memory.max": "max",
        },
    )
    assert cgroup_memory_limit(root) == int(V1_NONE)  # a number, but above RAM
    assert memory_source(root) == (24641536 * 1024, "ram")
    assert cgroup_memory_limit(tree(tmp_path / "bare", None, {})) is None


def test_this_process_cgroup_is_read() -> None:
    v2, v1 = own_cgroups()
    assert v2.startswith("/") and v1.startswith("/")
    limit, source = memory_source()
    assert limit > 256 * 2**20 and source in ("cgroup", "ram")
