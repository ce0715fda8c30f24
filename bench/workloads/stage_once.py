"""Stage DATA_URL into FOLDER with the entrypoint's own code (storage/stage.py), as a node does."""
import os
import sys

from entrypoint.contract.urls import parse_bucket_url
from entrypoint.storage.client import make_client
from entrypoint.storage.stage import stage_data

url = parse_bucket_url(sys.argv[1])
stage_data(make_client(url, dict(os.environ)), url, sys.argv[2], print, dict(os.environ))
