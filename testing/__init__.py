"""The harness the tests (tests/) and the benchmarks (bench/) share: nothing here is a test.

    ports.py      free ports, below the kernel's ephemeral range, never the same twice
    processes.py  a job's process environment on this machine; running commands with a time limit
    cluster.py    the nodes of one job on loopback (127.0.0.k), tracked and stopped together
    results.py    the RESULT lines the bundled examples print, and what "trained" means
    census.py     what a job's processes listen on, and where other hosts reach it
    s3.py         a real S3 server (SeaweedFS) on loopback, and a counting, throttling proxy before it
    etcd.py       a real etcd cluster on loopback, one process a member, each stoppable

Both tests/ and bench/ import it; it imports neither.
"""
