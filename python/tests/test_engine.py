"""Engine options (values and messages as the FOLIOSWAP_* variables'), exceptions, stats."""

import errno
import os
import subprocess
import sys

import numpy
import pytest

import folioswap


def engine_error(env):
    """The message the engine gives when configured by the environment (`env`)."""
    code = (
        "import folioswap\n"
        "try:\n"
        "    folioswap.Engine(memory_high=None)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FOLIOSWAP_")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(
    "option, value",
    [
        ("folio_size", "3K"),
        ("memory_high", "lots"),
        ("compressor", "brotli"),
        ("max_pool", "-5%"),
        ("swap_file", "/var/tmp"),
        ("split_swap", "maybe"),
        ("page_cluster", "10"),
    ],
)
def test_bad_values_raise_value_error_with_the_engines_message(option, value):
    kwargs = {"memory_high": None} if option != "memory_high" else {}
    with pytest.raises(ValueError) as e:
        folioswap.Engine(**kwargs, **{option: value})
    var = "FOLIOSWAP_" + option.upper()
    assert str(e.value).startswith(f'{var}="{value}" is not valid: expected ')
    assert str(e.value) == engine_error({var: value}), "the message must be the environment variable's"


def test_messages_name_what_is_accepted():
    with pytest.raises(ValueError, match="4K, 8K, 16K"):
        folioswap.Engine(folio_size="3K")
    with pytest.raises(ValueError, match="at least 8M"):
        folioswap.Engine(memory_high="1M")
    with pytest.raises(ValueError, match=r"lz4, zstd, zstd:LEVEL \(1-19\) or none"):
        folioswap.Engine(compressor="zstd:40")


def test_memory_high_too_small_for_the_folios():
    with pytest.raises(ValueError, match='memory_high="8M" is not valid: expected at least 16M'):
        folioswap.Engine(memory_high="8M", folio_size="2M", fault_threads=4)


def test_unknown_option_names_the_key():
    with pytest.raises(TypeError, match="'no_such_knob'") as e:
        folioswap.Engine(no_such_knob=1)
    assert "memory_high" in str(e.value) and "folio_size" in str(e.value)
    with pytest.raises(TypeError, match="'threshold'.*preloaded library"):
        folioswap.Engine(threshold="1M")
    with pytest.raises(TypeError, match="'memory_hihg'"):
        folioswap.Engine(memory_hihg="1G")


def test_option_values_of_other_types():
    e = folioswap.Engine(memory_high=32 << 20, split_swap=True, vma_ra_enabled=False, min_compression_ratio=1.5, page_cluster=2, swap_file="none")
    c = e.config
    assert c["memory_high"] == 32 << 20
    assert c["split_swap"] is True and c["vma_ra_enabled"] is False
    assert c["min_compression_ratio"] == 1.5 and c["page_cluster"] == 2
    with pytest.raises(TypeError, match="option 'folio_size'"):
        folioswap.Engine(folio_size=[4096])
    assert folioswap.Engine(memory_high="max").config["memory_high"] is None
    assert folioswap.Engine().config["memory_high"] == 256 << 20
    assert "memory_high" in folioswap.option_names() and "swap_file" in folioswap.option_names()


def test_environment_gives_defaults_and_options_override_it():
    code = "import folioswap; c = folioswap.Engine().config; print(c['compressor']['name'], c['memory_high'])"
    env = {**os.environ, "FOLIOSWAP_COMPRESSOR": "none", "FOLIOSWAP_MEMORY_HIGH": "64M"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    # memory_high is always set by Engine (default 256M); other knobs come from the environment.
    assert out.stdout.split() == ["none", str(256 << 20)]


def test_system_refusals_raise_os_error_with_errno():
    with pytest.raises(OSError) as e:
        folioswap.Engine(memory_high="16M", swap_file="/nonexistent-folioswap-dir/swap:16M")
    assert e.value.errno == errno.ENOENT and isinstance(e.value, FileNotFoundError)
    assert "cannot create a swap file at /nonexistent-folioswap-dir/swap" in str(e.value)


def test_existing_swap_file_path_is_file_exists_error(tmp_path):
    path = tmp_path / "taken"
    path.write_bytes(b"x")
    with pytest.raises(FileExistsError) as e:
        folioswap.Engine(memory_high="16M", swap_file=f"{path}:16M")
    assert e.value.errno == errno.EEXIST and "never overwrites" in str(e.value)


def test_swap_file_in_a_directory(tmp_path):
    e = folioswap.Engine(memory_high="16M", folio_size="64K", swap_file=f"{tmp_path}:64M", max_pool="2M")
    a = e.zeros(48 << 20, dtype="u1")
    rng = numpy.random.default_rng(1)
    chunks = [rng.integers(0, 256, 4 << 20, dtype=numpy.uint8) for _ in range(12)]  # incompressible
    for i, c in enumerate(chunks):
        a[i * (4 << 20) : (i + 1) * (4 << 20)] = c
    for i, c in enumerate(chunks):
        assert (a[i * (4 << 20) : (i + 1) * (4 << 20)] == c).all()
    s = e.stats()
    assert s["pswpout"] > 0 and s["pswpin"] > 0, "incompressible folios must go to the swap file and back"
    assert s["swap"]["size_bytes"] == 64 << 20
    assert os.listdir(tmp_path) == [], "the swap file is unlinked"


def test_stats_has_the_json_counters():
    e = folioswap.Engine(memory_high="16M", swap_file="none")
    s = e.stats()
    assert isinstance(s, dict)
    for key in ["zswpout", "zswpin", "pswpout", "pswpin", "pgfault", "thp_swpout", "per_size", "memory", "fault_latency", "uffd", "install"]:
        assert key in s, key
    for key in ["charged_bytes", "resident_bytes", "pool_total_bytes", "managed_bytes", "memory_high"]:
        assert key in s["memory"], key
    assert s["memory"]["memory_high"] == 16 << 20
    a = e.zeros(32 << 20, dtype="u1")
    a[:] = 1
    assert int(a.sum()) == 32 << 20
    t = e.stats()
    assert t["pgfault"] > s["pgfault"] and t["zswpout"] > 0
    # The default folio size, 64K: 512 folios first touched.
    assert t["per_size"]["64kB"]["zswpout"] > 0 and t["per_size"]["64kB"]["anon_fault_alloc"] == 512
