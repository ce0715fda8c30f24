"""Running a node's processes: what to start, the one supervision loop, and how they end.

    specs.py       ProcessSpec (what a launcher asks to start) and the environment builders
    loop.py        the one supervision loop every runner shares (supervise, Watch, Runner)
    supervisor.py  the Supervisor: starts a node's processes and ends them together
    reaper.py      a node's processes end with it, even when its entrypoint is killed outright
    signals.py     SIGTERM/SIGINT recorded, SIGUSR1 asks for the status
    outcome.py     what became of a node: Outcome and NodeState
    log.py         the entrypoint's own lines and its processes', written whole

Nothing here knows about other nodes: the job (job/) and the launchers sit above it.
"""
