"""Stage DATA_URL into FOLDER with the entrypoint's own code (storage/stage.py), as a node
does; prints `PHASE client=... stage=...`: making the boto3 client (which a node does once
at start, for its checks, whether or not it stages), then the staging itself (listing and
fetching)."""
import os
import sys
import time

t0 = time.perf_counter()
from entrypoint.contract.urls import parse_bucket_url  # noqa: E402
from entrypoint.storage.client import make_client  # noqa: E402
from entrypoint.storage.stage import stage_data  # noqa: E402

url = parse_bucket_url(sys.argv[1])
client = make_client(url, dict(os.environ))
t1 = time.perf_counter()
stage_data(client, url, sys.argv[2], print, dict(os.environ))
print(f"PHASE client={t1 - t0:.4f} stage={time.perf_counter() - t1:.4f}", flush=True)
