"""Shared by the tests: every test needs an engine, so userfaultfd must be there.

Where it is not (no root and no user-mode-only userfaultfd, a kernel without it), every
test fails with the engine's own message saying what is missing: never skipped."""

import pytest

import folioswap

_START_ERROR = []


def _probe():
    if not _START_ERROR:
        try:
            folioswap.Engine(memory_high="16M", folio_size="64K", swap_file="none")
            _START_ERROR.append(None)
        except OSError as e:
            _START_ERROR.append(f"folioswap cannot start an engine on this machine: {e}")
    return _START_ERROR[0]


@pytest.fixture(autouse=True)
def _needs_userfaultfd():
    why = _probe()
    if why is not None:
        pytest.fail(why, pytrace=False)
