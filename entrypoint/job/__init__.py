"""The job: this node among the others, from joining to finishing together. Framework-neutral:
a launcher adds its own part of the meeting through its class (launchers/base.py).

    placement.py  where a node stands: NodeInfo, Placement
    members.py    the claims, node records and launch announcement (keys)
    ends.py       exits, aborts, done and left (keys)
    join.py       the plan -> a JoinedJob (Job across nodes, LocalJob on one)
    peers.py      the same with JOB_STORE: nodes that meet on etcd, no master (PeerJob)
    watch.py      liveness while the processes run: heartbeats, failures, lost nodes
    rounds.py     elastic jobs: the training rounds and the nodes lost without a reset
    finish.py     how a node's outcome becomes the job's end on every node
"""
