"""Object storage: DATA_DIR and CHECKPOINT_DIR in a bucket (s3://, oss://), copied on each node.

    client.py    the S3 client from the standard AWS variables and chain; its errors in one line
    probe.py     before anything starts: can this node read the data, write the checkpoints
    transfer.py  parallel, multipart transfers of many objects, with a progress line
    stage.py     data: the prefix staged once per node into CACHE_DIR, kept by size and ETag
    manifest.py  what the bucket holds of the checkpoints, written last; what a resume takes
    shards.py    the shard files a DCP checkpoint's .metadata names, read without unpickling
    resume.py    checkpoints: what a resume needs, fetched before the ranks start
    mirror.py    checkpoints: each finished file uploaded while training goes on, flushed at the end
    node.py      the node's storage from start to end, for main.py

The scripts see only folders (contract/config.py maps each URL to its folder in CACHE_DIR),
so every framework's own reader and writer works unchanged. boto3 (credentials, probes,
listings) and obstore (transfers) are imported here only, and only when a URL is given.
"""
