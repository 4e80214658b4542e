"""``jaxoff io-bench`` reads its sizes with the planner's parse_size in binary mode: its help
says ``64M`` is 64 MiB, and block sizes must be whole 4 KiB pages, which decimal megabytes are
not."""

import pytest

from jaxoff._errors import ConfigError
from jaxoff._iobench import IOBenchConfig, _sizes, parse_size
from jaxoff.plan._hardware import parse_size as plan_parse_size


def test_io_bench_units_are_binary_as_its_help_says():
    assert "64M = 64 MiB" in IOBenchConfig.__doc__
    for text in ("64M", "64MB", "64MiB", "64m", " 64 M "):
        assert parse_size(text) == 64 * 2**20, text
    assert parse_size("4K") == 4096 and parse_size("1G") == 2**30 and parse_size("512") == 512
    assert parse_size("1.5M") == 3 * 2**19
    assert _sizes("block-sizes", "1M,8M", multiple=4096) == [2**20, 8 * 2**20]


def test_the_planner_keeps_decimal_units_without_i():
    assert plan_parse_size("64M") == 64e6 and plan_parse_size("64MB") == 64e6
    assert plan_parse_size("64MiB") == 64 * 2**20
    assert plan_parse_size("64M", binary=True) == 64 * 2**20


@pytest.mark.parametrize(
    "text, needle",
    [
        ("lots", "'lots' is not a size"),
        ("-64M", "must be a positive multiple"),
        ("1000", "multiple of 4K"),
    ],
)
def test_bad_sizes_name_the_option(text, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        _sizes("sizes", text, multiple=4096)
    assert str(e.value).startswith(f"--sizes '{text}'")
