"""The unit tier: pure logic (the contract, the plan, the matrix, the rendering), plus the
job store, tunnels and supervisor exercised as real processes on loopback, each test in
seconds. `pytest -m unit` runs this tier alone (about 2 minutes); the shared harness they
use is testing/ (plans.py, ports.py)."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/unit/" in str(item.fspath):
            item.add_marker(pytest.mark.unit)
