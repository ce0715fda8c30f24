"""`disttrain status`: the job as this container's entrypoint sees it (the master sees the
whole job; a worker its own ranks), from the file it writes once a second (disttrain/status.py's format).
`disttrain variables`: every variable the image takes. `disttrain secret`: a new JOB_SECRET.

    docker exec CONTAINER disttrain status [--json]
    docker run --rm IMAGE disttrain variables
    docker run --rm IMAGE disttrain secret > job_secret

The image's `disttrain` command runs this module (python3 -m entrypoint.commands); it lives
with the entrypoint because two of its answers are the entrypoint's (the secret's format, the
variables' reference), and `disttrain` itself, the library the training imports, imports
nothing of the entrypoint.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from disttrain import status
    parser = argparse.ArgumentParser(prog="disttrain", description=__doc__.split("\n\n")[0].replace("\n", " "))
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("status", help="the job's ranks: steps, step time, idle time, who is behind")
    show.add_argument("--json", action="store_true", help="the status file as it is")
    show.add_argument("--file", default=None, help=f"the status file (default: ${status.VAR}, else "
                                                   f"{status.default_path({})})")
    commands.add_parser("variables", help="every variable this image takes: default, what is allowed, meaning")
    commands.add_parser("secret", help="a new JOB_SECRET: 256 bits from the system's generator, as 64 hex digits")
    args = parser.parse_args(argv)
    if args.command == "secret":
        from .security.secret import new_secret
        print(new_secret())
        return 0
    if args.command == "variables":
        from .contract.reference import plain
        print(plain())
        return 0
    path = args.file or status.default_path()
    current = status.read(path)
    if current is None:
        print(f"disttrain: no status at {path}: is the entrypoint running training in this container?",
              file=sys.stderr)
        return 1
    print(json.dumps(current, indent=1) if args.json else "\n".join(status.table(current)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
