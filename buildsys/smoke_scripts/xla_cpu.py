"""torch-xla on XLA's CPU client (PJRT_DEVICE=CPU, CPU_NUM_DEVICES=N): rows [d + 1] * 4, one
per device, sharded over N devices with SPMD and summed by XLA across them."""
import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

xr.use_spmd()
devices = xr.global_runtime_device_count()
mesh = xs.Mesh(np.arange(devices), (devices, 1), ("data", "model"))
rows = torch.arange(1, devices + 1, dtype=torch.float32).unsqueeze(1).repeat(1, 4).to(torch_xla.device())
xs.mark_sharding(rows, mesh, ("data", None))
total = rows.sum(dim=0)
torch_xla.sync()
sharding = torch_xla._XLAC._get_xla_sharding_spec(rows).replace(" ", "")
print(f"RESULT xla devices={devices} sharding={sharding} sum={total.cpu().tolist()}", flush=True)
