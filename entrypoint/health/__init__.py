"""Health: the training processes' progress, hangs and stragglers, without touching the script.

    progress.py       this node's view of its ranks' progress files (disttrain/progress.py writes them)
    stacks.py         reading a stack dump: where a rank's main thread is
    hangs.py          judging progress: who hangs, who straggles, what the dump says (pure)
    vigil.py          a node's watch over its own ranks; the master's Decider; LocalWatch on one node
    hang_protocol.py  the hang protocol across nodes, and its keys in the job store
    watching.py       what a runner watches: the job's liveness (job/watch.py) with this room's checks

The status file `disttrain status` reads is disttrain/status.py's format.
"""
