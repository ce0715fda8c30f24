#!/usr/bin/env python3
"""Build the distributed-training image matrix (the command line is buildsys/cli.py).

    python build.py list | render | build | test | ci-matrix   (--help for the options)

Installed with pip (`pip install -e .`), the same command is `disttrain-build`.
"""

import sys

from buildsys.cli import main

if __name__ == "__main__":
    sys.exit(main())
