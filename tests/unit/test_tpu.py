"""TPU hosts, as data: detection from a /sys and /dev tree, and the plan from the variables
a Cloud TPU VM (or GKE's TPU pods) sets. No chip is needed; none is used."""

import pytest

from entrypoint.machine import hardware
from entrypoint.contract.config import ConfigError
from entrypoint.explain import explain
from entrypoint.machine.hardware import Hardware
from entrypoint.launchers.xla import XlaHost
from entrypoint.main import preflight_summary
from entrypoint.contract.manifest import Image
from entrypoint.job.placement import NodeInfo, Placement
from entrypoint.plan import plan_from_env, plan_processes

FW, LA = ["pytorch"], ["native"]
V4 = Hardware(gpus=0, cpus=240, shm_bytes=64 << 30, tpu_chips=4, tpu_kind="v4",
              tpu_devices=("/dev/accel0", "/dev/accel1", "/dev/accel2", "/dev/accel3"))
CPU = Hardware(gpus=0, cpus=2, shm_bytes=64 << 20)
GPU = Hardware(gpus=2, cpus=16, shm_bytes=8 << 30)


def plan(hw=V4, xla=True, **env):
    return plan_from_env({k: str(v) for k, v in env.items()}, Image(FW, LA, xla=xla), hw, ("--steps", "3"),
                         python="py")


def error(hw=V4, xla=True, **env) -> str:
    with pytest.raises(ConfigError) as info:
        plan(hw, xla, **env)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- detection

def pci(root, slot, vendor, device):
    folder = root / "bus/pci/devices" / slot
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "device").write_text(device + "\n")


def test_tpu_chips_are_googles_tpu_pci_functions(tmp_path):
    for i in range(4):
        pci(tmp_path, f"0000:00:0{i + 4}.0", "0x1ae0", "0x005e")            # TPU v4
    pci(tmp_path, "0000:00:03.0", "0x1ae0", "0x0042")                       # another Google function
    pci(tmp_path, "0000:00:02.0", "0x10de", "0x2330")                       # an NVIDIA GPU
    assert hardware.tpu_chips(str(tmp_path)) == (4, "v4")
    assert hardware.tpu_chips(str(tmp_path / "nothing")) == (0, None)


def test_tpu_device_files_accel_and_vfio(tmp_path):
    for name in ("accel0", "accel1", "accel10", "accel2", "nvidia0", "accelerator"):
        (tmp_path / name).touch()
    (tmp_path / "vfio").mkdir()
    for name in ("vfio", "0", "1"):                                          # v5e/v6e: /dev/vfio/N
        (tmp_path / "vfio" / name).touch()
    found = hardware.tpu_device_files(str(tmp_path))
    assert found == tuple(str(tmp_path / n) for n in ("accel0", "accel1", "accel2", "accel10", "vfio/0", "vfio/1"))


def test_detect_reports_chips_and_device_files(tmp_path):
    sys_root, dev_root = tmp_path / "sys", tmp_path / "dev"
    dev_root.mkdir()
    (dev_root / "vfio").mkdir()
    for i in range(8):
        pci(sys_root, f"0000:00:{i + 4:02x}.0", "0x1ae0", "0x006f")          # TPU v6e
        (dev_root / "vfio" / str(i)).touch()
    hw = hardware.detect({"CUDA_VISIBLE_DEVICES": ""}, str(sys_root), str(dev_root))
    assert (hw.tpu_chips, hw.tpu_kind, len(hw.tpu_devices), hw.gpus) == (8, "v6e", 8, 0)
    assert hw.tpu_text() == f"8 TPU v6e chip(s) ({dev_root}/vfio/0..{dev_root}/vfio/7)"
    bare = hardware.detect({"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path / "none"), str(dev_root))
    assert (bare.tpu_chips, bare.tpu_devices, bare.tpu_text()) == (0, (), "no TPU")


# --------------------------------------------------------------------------- one TPU host

def test_tpu_host_runs_one_xla_process_per_host():
    p = plan()
    assert (p.accelerator.kind, p.accelerator.pjrt_device, p.nproc, p.world_size) == ("tpu", "TPU", 1, None)
    assert p.env["PJRT_DEVICE"] == "TPU" and isinstance(p.launcher, XlaHost)
    [spec] = plan_processes(p, Placement(0, (NodeInfo(0, "127.0.0.1", 1),), master_port=41000))
    assert spec.argv == ("py", "-u", "/app/code/train.py", "--steps", "3")     # no torchrun: PJRT's own launch
    assert (spec.env["MASTER_ADDR"], spec.env["MASTER_PORT"]) == ("127.0.0.1", "41000")
    assert "TPU_WORKER_ID" not in spec.env and "RANK" not in spec.env


def test_one_process_per_chip_when_asked():
    p = plan(NPROC_PER_NODE=4)
    [spec] = plan_processes(p, Placement(0, (NodeInfo(0, "127.0.0.1", 4),)))
    assert spec.argv[:3] == ("py", "-m", "entrypoint.launchers.torchrun.run") and "--nproc-per-node=4" in spec.argv
    assert spec.env["PJRT_DEVICE"] == "TPU" and not isinstance(p.launcher, XlaHost) and p.world_size == 4
    assert "NPROC_PER_NODE=8" in error(NPROC_PER_NODE=8) and "this host has 4" in error(NPROC_PER_NODE=8)


def test_preflight_and_explain_name_the_accelerator():
    p = plan()
    summary = preflight_summary(p)
    assert "accelerator tpu, PJRT_DEVICE=TPU" in summary and "4 TPU v4 chip(s) (/dev/accel0../dev/accel3)" in summary
    text = explain(p, plan_processes(p, Placement(0, (NodeInfo(0, "127.0.0.1", 1),))), {})
    assert "accelerator: tpu, PJRT_DEVICE=TPU; 4 TPU v4 chip(s)" in text and "one PyTorch/XLA process per host" in text
    assert "accelerator cpu;" in preflight_summary(plan(CPU, xla=False))


# --------------------------------------------------------------------------- TPU slices across hosts

GKE_WORKER_1 = dict(TPU_WORKER_HOSTNAMES="t-w-0.t,t-w-1.t", TPU_WORKER_ID=1, TPU_ACCELERATOR_TYPE="v4-16",
                    TPU_SKIP_MDS_QUERY="true", TPU_HOST_BOUNDS="1,1,2", TPU_CHIPS_PER_HOST_BOUNDS="2,2,1")


def test_the_variables_a_tpu_slice_sets_become_the_placement():
    p = plan(**GKE_WORKER_1)
    c = p.config
    assert (c.train_mode, c.num_nodes, c.node_rank, c.role, c.master_addr) == ("distributed", 2, 1, "worker", "t-w-0.t")
    assert p.rendezvous.exchange and not p.rendezvous.serve_store
    nodes = [NodeInfo(0, "10.0.0.1", 1), NodeInfo(1, "10.0.0.2", 1)]
    [spec] = plan_processes(p, Placement(1, tuple(nodes), iface="ens8"))
    assert "TPU_WORKER_ID" not in spec.env and "TPU_WORKER_HOSTNAMES" not in spec.env    # the platform's stay
    assert (spec.env["MASTER_ADDR"], spec.env["MASTER_PORT"], spec.env["NODE_RANK"]) == ("t-w-0.t", "29501", "1")


def test_tpu_worker_variables_derived_from_the_job_stores_placement():
    p = plan(ROLE="worker", NUM_NODES=3, NODE_RANK=2, MASTER_ADDR="10.0.0.1", MASTER_PORT=29400, XLA_PORT=29411)
    nodes = [NodeInfo(2, "10.0.0.3", 1), NodeInfo(0, "10.0.0.1", 1), NodeInfo(1, "10.0.0.2", 1)]
    [spec] = plan_processes(p, Placement(2, tuple(nodes), iface="ens8", master_port=29400))
    assert spec.env["TPU_WORKER_ID"] == "2" and spec.env["TPU_WORKER_HOSTNAMES"] == "10.0.0.1,10.0.0.2,10.0.0.3"
    assert (spec.env["MASTER_ADDR"], spec.env["MASTER_PORT"]) == ("10.0.0.1", "29411")
    assert spec.env["GLOO_SOCKET_IFNAME"] == "ens8"
    per_chip = plan(ROLE="master", NUM_NODES=2, MASTER_ADDR="10.0.0.1", NPROC_PER_NODE=4)
    [torchrun] = plan_processes(per_chip, Placement(0, (NodeInfo(0, "10.0.0.1", 4), NodeInfo(1, "10.0.0.2", 4))))
    assert torchrun.env["TPU_WORKER_ID"] == "0" and torchrun.env["TPU_WORKER_HOSTNAMES"] == "10.0.0.1,10.0.0.2"


def test_behind_a_secret_the_xla_store_is_the_job_store_through_the_nodes_tunnel():
    """torch_xla's xla:// handler takes TORCHELASTIC_USE_AGENT_STORE (every process a client),
    so no process 0 serves a store on XLA_PORT's every interface; the dry run says so."""
    p = plan(ROLE="worker", NUM_NODES=2, NODE_RANK=1, MASTER_ADDR="10.0.0.1", XLA_PORT=29411,
             JOB_SECRET="3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e")
    nodes = (NodeInfo(0, "10.0.0.1", 1), NodeInfo(1, "10.0.0.2", 1))
    [spec] = plan_processes(p, Placement(1, nodes, store_endpoint="127.0.0.1:41234"))
    assert (spec.env["MASTER_ADDR"], spec.env["MASTER_PORT"], spec.env["TORCHELASTIC_USE_AGENT_STORE"]) == \
        ("127.0.0.1", "41234", "True")
    assert "behind JOB_SECRET" in p.launcher.describe() and p.launcher.open_despite_secret() == []


def test_a_tpu_worker_must_know_its_worker_number():
    message = error(ROLE="worker", NUM_NODES=2, MASTER_ADDR="10.0.0.1")
    assert "NODE_RANK is not set" in message and "TPU worker number" in message


def test_tpu_slices_are_not_elastic():
    assert "fixed number of hosts" in error(ROLE="master", MASTER_ADDR="m", MIN_NODES=1, MAX_NODES=2)


def test_a_platforms_worker_id_must_agree_with_node_rank():
    assert "conflicts with TPU_WORKER_ID" in error(**GKE_WORKER_1, NODE_RANK=0)


# --------------------------------------------------------------------------- asking for what is not there

def test_asking_for_a_tpu_without_one_fails_in_one_line():
    message = error(CPU, ACCELERATOR="tpu")
    assert message.startswith("ACCELERATOR='tpu': no TPU on this host") and "allowed here: auto, cpu" in message
    message = error(CPU, xla=False, ACCELERATOR="tpu")
    assert "only the tpu variant carries" in message


def test_tpu_chips_the_container_cannot_open():
    hidden = Hardware(gpus=0, cpus=8, tpu_chips=4, tpu_kind="v5e", tpu_devices=())
    for env in ({}, {"ACCELERATOR": "tpu"}):
        message = error(hidden, **env)
        assert "4 TPU v5e chip(s) on the PCI bus but no /dev/accel* or /dev/vfio/*" in message
        assert "--privileged" in message
    assert plan(hidden, ACCELERATOR="cpu").accelerator.kind == "cpu"


def test_a_tpu_host_without_pytorch_xla_in_the_image_runs_on_cpu_and_says_so():
    p = plan(V4, xla=False)
    assert p.accelerator.kind == "cpu" and "PJRT_DEVICE" not in p.env
    assert any("this image has no PyTorch/XLA" in w for w in p.warnings)


def test_gpu_choice():
    assert "ACCELERATOR='gpu': no GPU visible" in error(CPU, ACCELERATOR="gpu")
    p = plan(GPU, xla=False, ACCELERATOR="cpu")
    assert p.nproc == 1 and p.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan(GPU, xla=False).nproc == 2


# --------------------------------------------------------------------------- XLA's CPU client

def test_xla_cpu_client_is_one_process():
    p = plan(CPU, PJRT_DEVICE="CPU")
    assert (p.accelerator.kind, p.env["PJRT_DEVICE"], isinstance(p.launcher, XlaHost)) == ("cpu", "CPU", True)
    for env in (dict(NPROC_PER_NODE=2), dict(ROLE="master", NUM_NODES=2, MASTER_ADDR="m")):
        message = error(CPU, PJRT_DEVICE="CPU", **env)
        assert message.startswith("PJRT_DEVICE='CPU': XLA's CPU client serves one process")


def test_pjrt_device_must_fit_image_and_host():
    assert "this image has no PyTorch/XLA" in error(CPU, xla=False, PJRT_DEVICE="CPU")
    assert "allowed in this image: CPU, TPU" in error(CPU, PJRT_DEVICE="CUDA")
    assert "no usable TPU here" in error(CPU, PJRT_DEVICE="TPU")
    assert "conflicts with ACCELERATOR=tpu" in error(ACCELERATOR="tpu", PJRT_DEVICE="CPU")
    assert plan(V4, PJRT_DEVICE="CPU").accelerator.pjrt_device == "CPU"   # XLA's CPU client on purpose
    assert plan(GPU, PJRT_DEVICE="CPU").nproc == 1                          # ... on a GPU host too


def test_xla_runs_data_parallel_sync_pytorch():
    assert "allowed: data_parallel" in error(PARALLEL_MODE="hybrid", TP_SIZE=2, NPROC_PER_NODE=4)
    assert "allowed with PJRT_DEVICE=TPU: sync" in error(SYNC_MODE="async")
