"""Each line a training process prints in one write, installed in every Python process of
the image (disttrain.pth). Under PYTHONUNBUFFERED=1 (the image's default, so that a crash
loses nothing) `print` writes the text and its newline apart; mpirun's --tag-output and
any pipe that several processes share then glue one rank's line to the next rank's
('...digest=ab[1,1]<stdout>:RESULT ...'). Line buffering keeps the promise of unbuffered
output (every line is out when printed) in one write per line (up to 8 KiB)."""

import sys


def install() -> None:
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "write_through", False) and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(line_buffering=True, write_through=False)
            except (ValueError, OSError):
                pass
