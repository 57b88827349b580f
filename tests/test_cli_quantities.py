"""The quantities of the command line: element counts (``bench --size``) and byte sizes
(``--max-shard-size``), read by one parser with one table of units."""

import argparse

import pytest

from neuron_kernels.cli.quantities import UNITS, parse_bytes, parse_size


@pytest.mark.parametrize(
    "text, count",
    [
        ("1", 1),
        ("1048576", 1 << 20),
        ("1k", 1000),
        ("1K", 1000),
        ("1Ki", 1 << 10),
        ("1Mi", 1 << 20),
        ("64Mi", 64 << 20),
        ("64mi", 64 << 20),
        ("2M", 2 * 10**6),
        ("3G", 3 * 10**9),
        ("3Gi", 3 << 30),
        ("1T", 10**12),
        ("1Ti", 1 << 40),
        (" 64 Mi ", 64 << 20),
        ("1.5k", 1500),
        ("0.5Ki", 512),
        ("123456789012345678", 123456789012345678),
    ],
)
def test_element_counts(text, count):
    assert parse_size(text) == count


@pytest.mark.parametrize(
    "text", ["", "0", "0k", "-1", "lots", "1.5", "0.0001k", "1MiB", "1kB", "1 k i", "1KI", "1e6", "1x", "k"]
)
def test_element_counts_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="give a positive element count such as 1048576, 1Mi"):
        parse_size(text)


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("1", 1),
        ("4096", 4096),
        ("1B", 1),
        ("5GB", 5 * 10**9),
        ("5gb", 5 * 10**9),
        ("500MB", 500 * 10**6),
        ("40KB", 40_000),
        ("40kb", 40_000),
        ("2GiB", 2 << 30),
        ("2Gib", 2 << 30),
        ("1.5Gi", 3 << 29),
        ("1.5GB", 1_500_000_000),
        ("2T", 2 * 10**12),
        ("1TiB", 1 << 40),
        ("64Mi", 64 << 20),
        (" 5 GB ", 5 * 10**9),
        ("1.5", 1),  # a fraction of a byte is dropped
        ("1.001kB", 1001),  # exact: not 1000, as 1.001 * 1000 in floating point
    ],
)
def test_byte_sizes(text, nbytes):
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["", "0", "0.5", "0GB", "-1GB", "lots", "5 G B", "5GBB", "5XB", "1e9", "GB"])
def test_byte_sizes_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="give a size such as 5GB, 500MB or 2GiB"):
        parse_bytes(text)


def test_one_table_of_units_for_both():
    """Every unit means the same in an element count and in a byte size."""
    for unit, factor in UNITS.items():
        assert parse_size(f"3{unit}") == parse_bytes(f"3{unit}") == parse_bytes(f"3{unit}B") == 3 * factor
