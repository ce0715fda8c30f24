"""JOB_SECRET: the job's shared secret and the TLS it keys.

    secret.py   the secret (JOB_SECRET / JOB_SECRET_FILE) -> one TLS identity per job
    tunnel.py   the Gate in front of a node's servers and the Tunnels its clients go through

Used by the job store's transport (store/) and by the launchers that serve something.
"""
