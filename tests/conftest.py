"""Shared test configuration.

Markers (pyproject.toml): `e2e` runs real multi-process training on this machine;
`docker` needs a Docker engine and the image built by build.py. CI runs them all.
"""

import os
import sys
from pathlib import Path

# Ryuk, testcontainers' reaper, is an image pulled from Docker Hub; no registry is
# reachable here, and the tests remove their own containers.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
