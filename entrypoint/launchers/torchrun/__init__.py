"""torchrun: PyTorch's launcher.

    launch.py         Torchrun: one node (a torchrun subprocess), and what torchrun is told (TorchrunLaunch)
    run.py            torchrun as that subprocess runs it: ending with the failed worker's own exit code
    agent.py          TorchrunAgent: across nodes, torch's elastic agent inside the entrypoint
    worker_stores.py  behind JOB_SECRET, the processes' own store for every rendezvous round
    node_ids.py       each node a distinct identity in torch's rendezvous, whatever its address and PID
    etcd_rendezvous.py  --rdzv-backend=etcd-v3 (JOB_STORE): torch's rendezvous and round store on etcd
"""
