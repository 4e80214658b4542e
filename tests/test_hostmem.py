"""Host RAM arithmetic of a paged GPU run, checked before anything is allocated."""

import doctest

import pytest

from jaxoff.aio import _hostmem
from jaxoff.aio._hostmem import (
    HostMemLimits,
    check_host_mem,
    host_mem_need,
    parse_cgroup_limit,
    parse_meminfo,
    read_host_mem_limits,
)

GIB = 1 << 30
MIB = 1 << 20


def test_need_adds_each_kind_with_slots_rounded_to_4k():
    need = host_mem_need(
        chunk_bytes=64 * MIB + 1,
        read_slots=16,
        write_slots=8,
        devices=2,
        ram_tier_bytes=10 * GIB,
        pageable_bytes=16 * MIB,
    )
    slot = 64 * MIB + 4096
    assert need.pinned_arena == 16 * slot
    assert need.ring_host == 2 * 8 * slot
    assert need.ram_tier == 10 * GIB
    assert need.pageable == 16 * MIB
    assert need.pinned == 32 * slot + 10 * GIB
    assert need.total == need.pinned + 16 * MIB


@pytest.mark.parametrize("bad", [dict(chunk_bytes=-1), dict(read_slots=1.5), dict(devices=True)])
def test_bad_budgets_are_refused(bad):
    kw = dict(chunk_bytes=MIB, read_slots=1, write_slots=1) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        host_mem_need(**kw)


def test_fits_gives_none_and_headroom_counts():
    need = host_mem_need(chunk_bytes=GIB, read_slots=2, write_slots=2)  # 4 GiB
    assert check_host_mem(need, HostMemLimits(mem_available=4 * GIB)) is None
    msg = check_host_mem(need, HostMemLimits(mem_available=4 * GIB), headroom=1)
    assert msg is not None and "headroom" in msg


def test_too_big_names_the_numbers_and_the_tier_that_fits():
    need = host_mem_need(
        chunk_bytes=GIB, read_slots=2, write_slots=2, ram_tier_bytes=20 * GIB, pageable_bytes=0
    )
    msg = check_host_mem(need, HostMemLimits(mem_available=100 * GIB, cgroup_limit=16 * GIB))
    assert msg.count("\n") == 0
    assert "needs 24.00 GiB" in msg
    assert "RAM tier 20.00 GiB" in msg
    assert "only 16.00 GiB is available" in msg
    assert "cgroup limit 16.00 GiB" in msg
    assert "lower `host_mem` to at most 12.00 GiB" in msg


def test_cgroup_usage_and_memavailable_both_bound():
    lim = HostMemLimits(mem_available=10 * GIB, cgroup_limit=32 * GIB, cgroup_usage=30 * GIB)
    assert lim.available == 2 * GIB
    assert HostMemLimits(mem_available=3 * GIB, cgroup_limit=32 * GIB).available == 3 * GIB
    assert (
        HostMemLimits(mem_available=3 * GIB, cgroup_limit=GIB, cgroup_usage=2 * GIB).available == 0
    )


def test_without_a_tier_it_says_to_shrink_the_budgets():
    need = host_mem_need(chunk_bytes=GIB, read_slots=8, write_slots=8)
    msg = check_host_mem(need, HostMemLimits(mem_available=4 * GIB))
    assert "shrink the read-ahead or ring budgets" in msg
    assert "--host-mem" not in msg


def test_parsers():
    assert parse_meminfo("MemTotal: 10 kB\nMemAvailable:    2048 kB\n") == 2048 * 1024
    with pytest.raises(ValueError, match="MemAvailable"):
        parse_meminfo("MemTotal: 10 kB\n")
    assert parse_cgroup_limit("max\n") is None
    assert parse_cgroup_limit("9223372036854771712\n") is None  # v1 "unlimited"
    assert parse_cgroup_limit("17179869184\n") == 16 * GIB


@pytest.mark.parametrize("v2", [True, False])
def test_read_limits_from_a_fake_tree(tmp_path, v2):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemAvailable: 4194304 kB\n")
    cg = tmp_path / ("sys/fs/cgroup" if v2 else "sys/fs/cgroup/memory")
    cg.mkdir(parents=True)
    (cg / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(f"{2 * GIB}\n")
    (cg / ("memory.current" if v2 else "memory.usage_in_bytes")).write_text(f"{GIB}\n")
    lim = read_host_mem_limits(str(tmp_path))
    assert lim == HostMemLimits(4 * GIB, 2 * GIB, GIB)
    assert lim.available == GIB


def test_read_limits_without_cgroup(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemAvailable: 1024 kB\n")
    assert read_host_mem_limits(str(tmp_path)) == HostMemLimits(1024 * 1024)


def test_this_machine_reads():
    assert read_host_mem_limits().available > 0


def test_doctests():
    assert doctest.testmod(_hostmem, raise_on_error=False).failed == 0
