"""Write the examples' dataset to DIR/dataset.npz (default: $DATA_DIR or /app/data)."""
import os
import sys

import numpy as np

from synthetic import make

folder = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DATA_DIR", "/app/data")
os.makedirs(folder, exist_ok=True)
x, y = make(samples=int(os.environ.get("SAMPLES", "4096")))
np.savez(os.path.join(folder, "dataset.npz"), x=x, y=y)
print(f"wrote {len(x)} samples to {folder}/dataset.npz")
