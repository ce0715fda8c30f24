"""JOB_SECRET: the job's shared secret and the TLS it keys.

    secret.py   the secret (JOB_SECRET / JOB_SECRET_FILE) -> one TLS identity per job
    tunnel.py   the Gate in front of a node's servers and the Tunnels its clients go through
    environ.py  the secret kept out of every environment a training process can read
    local_peer.py  who owns a loopback connection (a Tunnel carries only its own uid's)

Used by the job store's transport (store/) and by the launchers that serve something.
"""
