"""The job store's transport: the key-value store through which a job's nodes meet.

    transport.py  the interface (get, set, add, compare-and-set, ...) and its errors
    tcp.py        its implementation: torch's TCPStore, served by the master (behind a TLS
                  Gate with JOB_SECRET), reached by every node
    etcd.py       a second implementation, on an etcd v3 cluster outside the job (JOB_STORE:
                  job/peers.py joins through it; docs/rendezvous.md)
    etcd_client.py  etcd's v3 JSON gateway: bytes in and out, each member tried in turn

The keys themselves, and what they mean, live beside the code that uses them: job/
(members, ends, heartbeats, rounds) and health/ (progress, hangs). A second backend
implements transport.py's interface only.
"""
