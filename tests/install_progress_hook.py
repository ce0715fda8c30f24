"""Install the image's per-interpreter progress hook (images/Dockerfile.j2 writes it into
disttrain.pth) into this interpreter's site-packages, so that the host tests' training
processes report their progress, and print each line in one write, as they do in the
image. Quiet where disttrain is not importable (the .pth line runs in every Python process
of the environment)."""

import pathlib
import sysconfig

# disttrain.output in every process; progress only where the entrypoint asked for it.
LINE = ('import os; exec("try:\\n from disttrain import gradsync, output, teardown\\n gradsync.install()\\n output.install()\\n teardown.install()\\n'
        'except ImportError:\\n pass"); '
        'exec("try:\\n from disttrain import progress\\n progress.install()\\n'
        'except ImportError:\\n pass") if os.environ.get("DISTTRAIN_PROGRESS") else None\n')

if __name__ == "__main__":
    path = pathlib.Path(sysconfig.get_paths()["purelib"], "disttrain-progress.pth")
    path.write_text(LINE)
    print(f"installed {path}")
