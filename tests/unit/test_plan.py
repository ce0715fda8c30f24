"""Planning is pure: environment + hardware -> commands, env and rendezvous, nothing started."""

import json

import pytest

from entrypoint.contract.config import ConfigError
from entrypoint.explain import assumed_placement, explain
from entrypoint.machine.hardware import Hardware, choose_interface
from entrypoint.launchers.horovod.fixed import HorovodGloo, HorovodMpi
from entrypoint.launchers.horovod.elastic import HorovodElastic
from entrypoint.launchers.torchrun.agent import TorchrunAgent
from entrypoint.contract.manifest import Image
from entrypoint.job.placement import NodeInfo
from entrypoint.plan import plan_processes
from testing.plans import FW, LA, at, nodes, plan

def test_nproc_defaults_to_gpus_else_one():
    assert plan().nproc == 1
    assert plan(Hardware(gpus=4, cpus=32, shm_bytes=16 << 30)).nproc == 4
    assert plan(NPROC_PER_NODE=3).nproc == 3


def test_local_torchrun():
    p = plan(NPROC_PER_NODE=2)
    [spec] = plan_processes(p, at(0, nodes(2)))
    argv = list(spec.argv)
    assert argv[:3] == ["py", "-m", "entrypoint.launchers.torchrun.run"] and "--standalone" in argv
    assert "--nproc-per-node=2" in argv and argv[-3:] == ["/app/code/train.py", "--steps", "3"]
    assert spec.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]: "
    assert spec.env["OMP_NUM_THREADS"] == "1" and spec.env["DATA_DIR"] == "/app/data"


def test_distributed_torchrun_uses_the_job_store_as_a_client():
    p = plan(NPROC_PER_NODE=2, NUM_NODES=2, ROLE="worker", MASTER_ADDR="master", MASTER_PORT=29500,
             RDZV_TIMEOUT=60)
    assert p.rendezvous.endpoint == "master:29500" and not p.rendezvous.serve_store and not p.rendezvous.exchange
    [spec] = plan_processes(p, at(1, nodes(2), iface="eth0"))
    argv = list(spec.argv)
    assert "--nnodes=2" in argv and "--rdzv-backend=c10d" in argv and "--rdzv-endpoint=master:29500" in argv
    assert "--rdzv-conf=is_host=0,join_timeout=60,read_timeout=60" in argv
    assert spec.env["NCCL_SOCKET_IFNAME"] == "eth0" and spec.env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_elastic_torchrun():
    p = plan(MIN_NODES=1, MAX_NODES=4, ROLE="master", MASTER_ADDR="m", MAX_RESTARTS=3, RDZV_TIMEOUT=60)
    [spec] = plan_processes(p, at(0, nodes(1)))
    argv = list(spec.argv)
    assert "--nnodes=1:4" in argv and "--max-restarts=3" in argv and "--monitor-interval=0.1" in argv
    assert ("--rdzv-conf=is_host=0,join_timeout=60,read_timeout=60,last_call_timeout=2,keep_alive_interval=1,"
            "keep_alive_max_attempt=3") in argv
    assert spec.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"        # pytorch/pytorch#135712
    assert spec.env["DISTTRAIN_JOB_STORE"] == "m:29500" and spec.env["DISTTRAIN_JOB_PREFIX"] == "disttrain/disttrain/"
    assert p.world_size is None and p.warnings == ()
    tuned = plan(MIN_NODES=1, MAX_NODES=4, ROLE="master", MASTER_ADDR="m", ELASTIC_LAST_CALL=5, ELASTIC_DEAD_AFTER=6)
    assert "last_call_timeout=5" in " ".join(plan_processes(tuned, at(0, nodes(1)))[0].argv)
    assert any("MAX_RESTARTS=0" in w and "first lost node" in w for w in tuned.warnings)


def test_elastic_horovod_starts_workers_on_demand_with_the_drivers_own_server():
    p = plan(LAUNCHER="horovod", MIN_NODES=1, MAX_NODES=3, ROLE="master", MASTER_ADDR="m")
    assert isinstance(p.launcher, HorovodElastic) and not p.rendezvous.exchange and not p.rendezvous.horovod_server
    assert plan_processes(p, at(0, nodes(1))) == []            # Horovod's ElasticDriver orders them
    assert "ElasticDriver" in p.starts and p.warnings == ()


def test_an_ordered_elastic_horovod_worker_reaches_the_rendezvous_by_its_nodes_own_way():
    """The driver's order names the master's address; behind JOB_SECRET the node gives its
    own route (its tunnel to the Gate, or the master's loopback port)."""
    p = plan(LAUNCHER="horovod", MIN_NODES=1, MAX_NODES=3, ROLE="worker", MASTER_ADDR="m")
    order = {"HOROVOD_RANK": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "m", "HOROVOD_GLOO_RENDEZVOUS_PORT": "29501",
             "HOROVOD_ELASTIC": "1"}
    plain = p.launcher.ordered(p, at(1, nodes(1, 1), iface="eth0"), order)
    tunnelled = p.launcher.ordered(p, at(1, nodes(1, 1), iface="eth0"), order, ("127.0.0.1", 41234))
    assert plain.label == "rank 1" and plain.env["HOROVOD_GLOO_IFACE"] == "eth0" and plain.env["NODE_RANK"] == "1"
    assert (plain.env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], plain.env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("m", "29501")
    assert (tunnelled.env["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
            tunnelled.env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("127.0.0.1", "41234")
    assert {k: v for k, v in tunnelled.env.items() if not k.startswith("HOROVOD_GLOO_RENDEZVOUS")} == \
           {k: v for k, v in plain.env.items() if not k.startswith("HOROVOD_GLOO_RENDEZVOUS")}


def test_fixed_size_torchrun_keeps_torchs_store_sharing():
    p = plan(NUM_NODES=2, ROLE="master", MASTER_ADDR="m")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan_processes(p, at(0, nodes(1, 1)))[0].env


def test_master_serves_store_and_horovod_rendezvous():
    p = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="master", MASTER_ADDR="m")
    r = p.rendezvous
    assert r.serve_store and r.exchange and r.horovod_server


def test_horovod_env_matches_what_horovodrun_sets():
    p = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m", NPROC_PER_NODE=2)
    specs = plan_processes(p, at(1, nodes(2, 2), iface="eth0", server_addr="m", server_port=29501))
    assert [s.label for s in specs] == ["rank 2", "rank 3"]
    env = specs[1].env
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "m" and env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "29501"
    assert env["HOROVOD_CONTROLLER"] == "gloo" and env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == \
        ("3", "4", "1", "2")
    assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("1", "2")
    assert env["HOROVOD_HOSTNAME"] == "node1" and env["HOROVOD_GLOO_IFACE"] == "eth0"
    assert specs[1].argv == ("py", "-u", "/app/code/train.py", "--steps", "3")


def test_horovod_worker_takes_the_masters_slots_and_imports_no_horovod_runner():
    """The master builds every slot's variables once (Launcher.launch_env) and announces
    them; a worker's processes from that announcement equal those it would build itself,
    and building them loads nothing of horovod.runner (its gloo_run costs a node's start)."""
    import subprocess
    import sys

    master = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="master", MASTER_ADDR="m", NPROC_PER_NODE=2)
    announced = json.loads(json.dumps(master.launcher.launch_env(nodes(2, 2))))     # through the store
    assert [e["HOROVOD_RANK"] for e in announced] == ["0", "1", "2", "3"]
    worker = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m", NPROC_PER_NODE=2)
    where = dict(iface="eth0", server_addr="m", server_port=29501)
    given = plan_processes(worker, at(1, nodes(2, 2), launch_env=tuple(announced), **where))
    assert given == plan_processes(worker, at(1, nodes(2, 2), **where))
    script = f"""
import json, sys
from testing.plans import plan, at, nodes
from entrypoint.plan import plan_processes
worker = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m", NPROC_PER_NODE=2)
specs = plan_processes(worker, at(1, nodes(2, 2), launch_env=tuple(json.loads({json.dumps(json.dumps(announced))}))))
assert [s.label for s in specs] == ["rank 2", "rank 3"], specs
print(sorted(m for m in sys.modules if m.startswith("horovod")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_horovod_uneven_nodes():
    p = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="master", MASTER_ADDR="m", NPROC_PER_NODE=2)
    specs = plan_processes(p, at(0, nodes(2, 1), iface="eth0"))
    assert [s.env["HOROVOD_SIZE"] for s in specs] == ["3", "3"]
    assert [s.env["HOROVOD_CROSS_SIZE"] for s in specs] == ["2", "1"]


def test_tensorflow_sync_tf_config():
    p = plan(FRAMEWORK="tensorflow", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m", NPROC_PER_NODE=2)
    assert p.rendezvous.exchange and p.launcher.ports_needed(master=True) == 2
    specs = plan_processes(p, at(1, nodes(2, 2)))
    configs = [json.loads(s.env["TF_CONFIG"]) for s in specs]
    assert configs[0]["cluster"] == {"worker": ["10.0.0.1:40000", "10.0.0.1:40001", "10.0.0.2:40010",
                                                 "10.0.0.2:40011"]}
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 2}, {"type": "worker", "index": 3}]
    assert specs[0].env["TF_USE_LEGACY_KERAS"] == "1"


def test_keras_opt_out_of_legacy_keras_is_honoured():
    p = plan(FRAMEWORK="keras", TF_USE_LEGACY_KERAS=0)
    assert p.env["TF_USE_LEGACY_KERAS"] == "0"


def test_tensorflow_async_parameter_servers_on_the_master():
    p = plan(FRAMEWORK="tensorflow", SYNC_MODE="async", NUM_NODES=2, ROLE="master", MASTER_ADDR="m", NUM_PS=2)
    assert p.launcher.ports_needed(master=True) == 1 + 1 + 2
    specs = plan_processes(p, at(0, [NodeInfo(0, "m", 1, (1, 2, 3, 4)), NodeInfo(1, "w", 1, (9,))]))
    assert [(s.label, s.critical) for s in specs] == [("chief", True), ("ps 0", False), ("ps 1", False),
                                                       ("worker 0", False)]
    cluster = json.loads(specs[0].env["TF_CONFIG"])["cluster"]
    assert cluster == {"chief": ["m:1"], "ps": ["m:2", "m:3"], "worker": ["m:4", "w:9"]}
    assert specs[1].argv[-2:] == ("-m", "disttrain.tf_server")


def test_tensorflow_async_worker_node_only_serves():
    p = plan(FRAMEWORK="tensorflow", SYNC_MODE="async", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m")
    specs = plan_processes(p, at(1, [NodeInfo(0, "m", 1, (1, 2, 3)), NodeInfo(1, "w", 1, (9,))]))
    assert [(s.label, s.critical) for s in specs] == [("worker 1", False)]


def test_mxnet_parameter_servers_on_the_master_workers_everywhere():
    p = plan(FRAMEWORK="mxnet", NUM_NODES=2, ROLE="master", MASTER_ADDR="m", NUM_PS=2, NPROC_PER_NODE=2)
    assert p.rendezvous.exchange and p.launcher.numeric_addr and p.launcher.ports_needed(master=True) == 1 + 2 + 2
    assert "dist_sync" in p.starts
    job = [NodeInfo(0, "10.0.0.1", 2, (50, 51, 52, 61, 60)), NodeInfo(1, "10.0.0.2", 2, (71, 70))]
    specs = plan_processes(p, at(0, job, iface="eth0"))
    assert [(s.label, s.critical) for s in specs] == [("scheduler", False), ("server 0", False), ("server 1", False),
                                                       ("rank 2", True), ("rank 3", True)]
    for s in specs:
        assert (s.env["DMLC_PS_ROOT_URI"], s.env["DMLC_PS_ROOT_PORT"]) == ("10.0.0.1", "50")
        assert (s.env["DMLC_NUM_SERVER"], s.env["DMLC_NUM_WORKER"], s.env["DMLC_INTERFACE"]) == ("2", "4", "eth0")
    scheduler, server0, server1, rank2, rank3 = specs
    assert scheduler.env["DMLC_ROLE"] == "scheduler" and scheduler.env["DMLC_USE_KUBERNETES"] == "1"
    assert scheduler.argv == ("py", "-u", "-m", "disttrain.mx_server")
    assert (server1.env["DMLC_ROLE"], server1.env["DMLC_NODE_HOST"], server1.env["PORT"]) == ("server", "10.0.0.1", "52")
    # a node's worker ports ascend with local rank, whatever order the OS gave them
    assert [(s.env["DMLC_ROLE"], s.env["PORT"], s.env["LOCAL_RANK"]) for s in (rank2, rank3)] == \
        [("worker", "60", "0"), ("worker", "61", "1")]
    assert (rank2.env["RANK"], rank2.env["WORLD_SIZE"], rank2.env["NODE_RANK"]) == ("2", "4", "0")
    assert rank2.argv == ("py", "-u", "/app/code/train.py", "--steps", "3")


def test_mxnet_ranks_follow_the_scheduler_addresses_descending_then_ports():
    """ps-lite numbers the workers by address (descending, as strings), then port."""
    p = plan(FRAMEWORK="mxnet", NUM_NODES=3, ROLE="worker", MASTER_ADDR="m", SYNC_MODE="async")
    assert p.launcher.ports_needed(master=False) == 1 and "dist_async" in p.starts
    job = [NodeInfo(0, "10.0.0.9", 1, (1, 2, 30)), NodeInfo(1, "10.0.0.10", 1, (40,)), NodeInfo(2, "10.0.0.2", 1, (50,))]
    ranks = {n: plan_processes(p, at(n, job))[0].env["RANK"] for n in (1, 2)}
    assert ranks == {1: "2", 2: "1"}                     # '10.0.0.9' > '10.0.0.2' > '10.0.0.10'
    assert [s.label for s in plan_processes(p, at(1, job))] == ["rank 2"]


def test_mxnet_local_and_horovod():
    local = plan(FRAMEWORK="mxnet", NPROC_PER_NODE=2)
    assert local.rendezvous is None and local.launcher.ports_needed(master=True) == 4
    specs = plan_processes(local, at(0, [NodeInfo(0, "127.0.0.1", 2, (5, 6, 7, 8))]))
    assert [s.label for s in specs] == ["scheduler", "server 0", "rank 0", "rank 1"]
    hvd = plan(FRAMEWORK="mxnet", LAUNCHER="horovod", NUM_NODES=2, ROLE="master", MASTER_ADDR="m")
    assert hvd.launcher.ports_needed(master=True) == 0 and not hvd.launcher.numeric_addr
    assert "HOROVOD_RANK" in plan_processes(hvd, at(0, nodes(1, 1), server_port=1))[0].env


def test_mxnet_parameter_servers_need_the_entrypoint_not_an_outer_launcher():
    with pytest.raises(ConfigError, match="FRAMEWORK=mxnet with LAUNCHER=native under mpirun"):
        plan(FRAMEWORK="mxnet", OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2)


def test_explain_on_a_worker_assumes_the_masters_servers():
    for env in (dict(FRAMEWORK="tensorflow", SYNC_MODE="async"), dict(FRAMEWORK="mxnet")):
        p = plan(NUM_NODES=2, ROLE="worker", MASTER_ADDR="m", NPROC_PER_NODE=2, **env)
        text = explain(p, plan_processes(p, assumed_placement(p)), {})
        assert "server" in text


def test_local_mpi_launcher_reenters_the_entrypoint_per_rank():
    p = plan(LAUNCHER="mpi", NPROC_PER_NODE=2)
    [spec] = plan_processes(p, at(0, nodes(2), master_port=12345))
    argv = list(spec.argv)
    assert argv[:3] == ["mpirun", "--np", "2"] and argv[-4:] == ["entrypoint.main", "--", "--steps", "3"]
    assert spec.env["MASTER_PORT"] == "12345" and spec.env["HOROVOD_CONTROLLER"] == "mpi"
    assert "-x" in argv and "ENTRYPOINT" in argv


def test_multi_node_mpi_runs_mpirun_on_the_master_only():
    master = plan(LAUNCHER="mpi", NUM_NODES=2, ROLE="master", MASTER_ADDR="m", HOSTFILE="/app/code/hosts")
    assert "--hostfile" in plan_processes(master, at(0, nodes(1, 1)))[0].argv
    worker = plan(LAUNCHER="mpi", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m", HOSTFILE="/app/code/hosts")
    assert plan_processes(worker, at(1, nodes(1, 1))) == []


def test_direct_rank_under_mpirun():
    p = plan(OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=1,
             OMPI_COMM_WORLD_LOCAL_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=2222)
    assert p.mode == "direct"
    [spec] = plan_processes(p, at(1, []))
    assert (spec.env["RANK"], spec.env["WORLD_SIZE"], spec.env["LOCAL_RANK"]) == ("1", "2", "1")
    assert spec.env["MASTER_PORT"] == "2222" and spec.argv[0] == "py"


def test_direct_multi_node_torch_needs_master_addr():
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set"):
        plan(SLURM_PROCID=0, SLURM_NNODES=2, SLURM_NTASKS=4)


def test_hybrid_layout_and_errors():
    p = plan(PARALLEL_MODE="hybrid", TP_SIZE=2, NPROC_PER_NODE=4)
    assert (p.env["TP_SIZE"], p.env["DP_SIZE"]) == ("2", "2")
    with pytest.raises(ConfigError, match="TP_SIZE=3: must divide the world size 4"):
        plan(PARALLEL_MODE="hybrid", TP_SIZE=3, NPROC_PER_NODE=4)
    with pytest.raises(ConfigError, match="hybrid needs both dimensions > 1"):
        plan(PARALLEL_MODE="hybrid", TP_SIZE=4, NPROC_PER_NODE=4)
    assert plan(PARALLEL_MODE="model_parallel", NPROC_PER_NODE=2).env["TP_SIZE"] == "2"


def test_preflight_warnings():
    shm = plan(Hardware(gpus=2, cpus=8, shm_bytes=64 << 20))
    assert any("/dev/shm is 64 MiB" in w and "--shm-size" in w for w in shm.warnings)
    over = plan(Hardware(gpus=1, cpus=8, shm_bytes=8 << 30), NPROC_PER_NODE=2)
    assert any("exceeds the 1 visible GPU" in w for w in over.warnings)
    assert plan(Hardware(gpus=0, cpus=8, shm_bytes=64 << 20)).warnings == ()


def test_interface_choice():
    table = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.5"], "docker0": ["172.17.0.1"]}
    assert choose_interface("10.0.0.1", "10.0.0.5", table, None) == ("eth0", [])
    name, warnings = choose_interface("192.168.9.9", "172.17.0.1", table, None)
    assert name == "docker0" and "Docker bridge" in warnings[0]
    assert choose_interface("10.0.0.1", "10.0.0.5", table, "eth0")[0] == "eth0"
    with pytest.raises(LookupError, match="NET_IFNAME='ib0': no such interface"):
        choose_interface("10.0.0.1", "10.0.0.5", table, "ib0")
    assert choose_interface("127.0.0.1", "127.0.0.1", table, None) == ("lo", [])


def test_explain_shows_the_plan_without_starting_anything():
    p = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="master", MASTER_ADDR="m", IB_HCA="mlx5_0:1")
    text = explain(p, plan_processes(p, at(0, nodes(1, 1), server_port=29501)), {})
    assert "Horovod" in text and "job store m:29500" in text and "NCCL_IB_HCA=mlx5_0:1" in text


def test_horovod_workers_also_get_torch_distributed_env():
    """A torch.distributed script under LAUNCHER=horovod joins one group (env://), on a port
    that is not the job store's."""
    p = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m", NPROC_PER_NODE=2)
    specs = plan_processes(p, at(1, nodes(2, 2), server_addr="m", server_port=29501, master_port=40111))
    env = specs[0].env
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("m", "40111")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("2", "4", "0")


def test_launched_processes_name_their_launcher_for_the_guard():
    for launcher in ("native", "horovod"):
        for framework in ("pytorch", "tensorflow"):
            p = plan(FRAMEWORK=framework, LAUNCHER=launcher, NPROC_PER_NODE=2)
            specs = plan_processes(p, at(0, nodes(2, ports=2), server_addr="127.0.0.1", server_port=1,
                                         master_port=2))
            assert {s.env["DISTTRAIN_LAUNCHER"] for s in specs} == {launcher}


def test_commands_get_the_shared_environment_and_the_interface():
    from entrypoint.plan import command_env

    env = command_env(plan(FRAMEWORK="keras", NET_IFNAME="ib0", NPROC_PER_NODE=2))
    assert env["OMP_NUM_THREADS"] == "1" and env["TF_USE_LEGACY_KERAS"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["HOROVOD_GLOO_IFACE"] == "ib0"
    assert "WORLD_SIZE" not in env and "DISTTRAIN_LAUNCHER" not in env


def test_every_process_prints_its_python_stack_when_it_crashes_unless_turned_off():
    from entrypoint.plan import command_env

    assert command_env(plan())["PYTHONFAULTHANDLER"] == "1"
    assert command_env(plan(PYTHONFAULTHANDLER="0"))["PYTHONFAULTHANDLER"] == ""      # Python's "off"


def test_one_cpu_node_runs_horovod_over_mpi_and_says_so():
    """One CPU node: Horovod's MPI controller under mpirun (Open MPI's shared memory beats
    Gloo's loopback TCP, README's Benchmarks); no Horovod rendezvous server is needed. Open
    MPI yields while it waits, torch's tensors get huge pages and Horovod cycles every
    0.1 ms, unless the user says otherwise."""
    from entrypoint.main import preflight_summary

    p = plan(LAUNCHER="horovod", NPROC_PER_NODE=2)
    assert isinstance(p.launcher, HorovodMpi) and p.rendezvous is None
    [spec] = plan_processes(p, at(0, nodes(2), master_port=12345))
    argv = list(spec.argv)
    assert argv[:3] == ["mpirun", "--np", "2"] and argv[-4:] == ["entrypoint.main", "--", "--steps", "3"]
    assert spec.env["HOROVOD_CONTROLLER"] == "mpi" and spec.env["HOROVOD_CPU_OPERATIONS"] == "mpi"
    assert spec.env["LAUNCHER"] == "horovod" and spec.env["DISTTRAIN_LAUNCHER"] == "horovod"
    assert "Open MPI shared memory" in p.starts and "Horovod over MPI" in preflight_summary(p)
    tuned = {"OMPI_MCA_mpi_yield_when_idle": "1", "THP_MEM_ALLOC_ENABLE": "1", "HOROVOD_CYCLE_TIME": "0.1"}
    assert {k: spec.env[k] for k in tuned} == tuned
    for name in tuned:                                 # the user's value, even "0", is left alone
        assert name not in plan(LAUNCHER="horovod", **{name: "0"}).env
    assert not set(tuned) & set(plan(LAUNCHER="mpi", NPROC_PER_NODE=2).env)                    # plain MPI: as given
    assert not set(tuned) & set(plan(LAUNCHER="horovod", HOROVOD_CONTROLLER="gloo").env)       # Gloo: as given


@pytest.mark.parametrize("case", ["gloo asked", "GPU", "two nodes", "no mpirun"])
def test_horovod_stays_on_gloo_across_nodes_on_gpus_without_mpirun_or_when_asked(case):
    from entrypoint.main import preflight_summary

    if case == "two nodes":
        p = plan(LAUNCHER="horovod", NUM_NODES=2, ROLE="master", MASTER_ADDR="m")
    elif case == "GPU":
        p = plan(Hardware(gpus=2, cpus=8, shm_bytes=8 << 30), LAUNCHER="horovod")
    elif case == "gloo asked":
        p = plan(LAUNCHER="horovod", NPROC_PER_NODE=2, HOROVOD_CONTROLLER="gloo")
    else:
        p = plan(image=Image(FW, ["native", "horovod"]), LAUNCHER="horovod", NPROC_PER_NODE=2)
    assert isinstance(p.launcher, HorovodGloo) and p.rendezvous.horovod_server
    assert "Horovod over Gloo" in preflight_summary(p)
    [spec, *_] = plan_processes(p, at(0, nodes(*([1, 1] if case == "two nodes" else [p.nproc])),
                                      server_addr="127.0.0.1", server_port=1))
    assert spec.env["HOROVOD_CONTROLLER"] == "gloo" and spec.argv[0] == "py"


def test_torchrun_runs_in_the_entrypoint_across_nodes_only():
    def in_process(p):
        return isinstance(p.launcher, TorchrunAgent)

    assert in_process(plan(NUM_NODES=2, ROLE="master", MASTER_ADDR="m"))
    assert in_process(plan(MIN_NODES=1, MAX_NODES=3, ROLE="worker", MASTER_ADDR="m"))
    assert not in_process(plan(NPROC_PER_NODE=2))                       # one node: no torch here
    assert not in_process(plan(NUM_NODES=2, ROLE="master", MASTER_ADDR="m", LAUNCHER="horovod"))
    assert not in_process(plan(NUM_NODES=2, ROLE="master", MASTER_ADDR="m", FRAMEWORK="tensorflow"))
    text = explain(p := plan(NUM_NODES=2, ROLE="master", MASTER_ADDR="m"), plan_processes(p, assumed_placement(p)), {})
    assert "agent runs inside the entrypoint" in text and "torch.distributed.run" in text


@pytest.mark.parametrize("env, image, kind", [
    (dict(NPROC_PER_NODE=2), Image(FW, LA), "Torchrun"),
    (dict(NUM_NODES=2, ROLE="master", MASTER_ADDR="m"), Image(FW, LA), "TorchrunAgent"),
    (dict(MIN_NODES=1, MAX_NODES=3, ROLE="worker", MASTER_ADDR="m"), Image(FW, LA), "TorchrunAgent"),
    (dict(LAUNCHER="horovod", NPROC_PER_NODE=2), Image(FW, LA), "HorovodMpi"),
    (dict(LAUNCHER="horovod", NPROC_PER_NODE=2), Image(FW, ["native", "horovod"]), "HorovodGloo"),
    (dict(LAUNCHER="horovod", NPROC_PER_NODE=2), Image(FW, LA, horovod_mpi=False), "HorovodGloo"),  # mpirun, Gloo-only Horovod
    (dict(LAUNCHER="horovod", NUM_NODES=2, ROLE="worker", MASTER_ADDR="m"), Image(FW, LA), "HorovodGloo"),
    (dict(LAUNCHER="horovod", MIN_NODES=1, MAX_NODES=2, ROLE="master", MASTER_ADDR="m"), Image(FW, LA),
     "HorovodElastic"),
    (dict(FRAMEWORK="tensorflow", LAUNCHER="horovod", MIN_NODES=1, MAX_NODES=2, ROLE="worker", MASTER_ADDR="m"),
     Image(FW, LA), "HorovodElastic"),
    (dict(LAUNCHER="mpi", NPROC_PER_NODE=2), Image(FW, LA), "Mpirun"),
    (dict(FRAMEWORK="keras"), Image(FW, LA), "TfConfig"),
    (dict(FRAMEWORK="mxnet", NUM_NODES=2, ROLE="master", MASTER_ADDR="m"), Image(FW, LA), "MxnetPs"),
    (dict(OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2, MASTER_ADDR="m"), Image(FW, LA), "Direct"),
])
def test_one_function_chooses_one_launcher_class(env, image, kind):
    """launchers.choose is the only place that decides; each configuration gets one class."""
    assert type(plan(image=image, **env).launcher).__name__ == kind


def test_the_address_a_node_publishes():
    from entrypoint.machine.hardware import choose_address

    names = {"m": "10.0.0.1", "me.local": "10.0.0.7"}
    pick = dict(master_addr="m", source_ip="10.0.0.2", resolve=names.get)
    assert choose_address(master=True, node_addr=None, numeric=False, **pick) == "m"      # the name workers use
    assert choose_address(master=False, node_addr=None, numeric=False, **pick) == "10.0.0.2"   # routes to the master
    assert choose_address(master=False, node_addr="me.local", numeric=False, **pick) == "me.local"
    assert choose_address(master=True, node_addr=None, numeric=True, **pick) == "10.0.0.2"    # ps-lite binds an IP
    assert choose_address(master=False, node_addr="me.local", numeric=True, **pick) == "10.0.0.7"


def test_the_manifest_says_whether_horovod_has_mpi(tmp_path):
    from entrypoint.contract.manifest import load

    def image(controllers):
        path = tmp_path / "manifest.json"
        path.write_text(json.dumps({"frameworks": FW, "launchers": LA, "horovod": {"controllers": controllers}}))
        return load({"DISTTRAIN_MANIFEST": str(path)})

    assert image(["gloo", "mpi"]).horovod_mpi is True and image(["gloo"]).horovod_mpi is False


def test_outside_an_image_horovod_itself_says_whether_it_has_mpi():
    """Read from the installed Horovod's extensions (the image's own wheel in the test
    venv, built with MPI), it agrees with Horovod's own mpi_built(), asked in a child
    process, and loads nothing of Horovod here."""
    import importlib.util
    import subprocess
    import sys

    from entrypoint.contract.manifest import detect, horovod_has_mpi, needed_libraries

    pytest.importorskip("horovod")
    image, loaded = detect(), set(sys.modules)
    assert image.horovod_mpi is None
    for family, framework in (("pytorch", "torch"), ("tensorflow", "tensorflow")):
        if importlib.util.find_spec(framework) is None:
            continue
        own = subprocess.run([sys.executable, "-c", f"import horovod.{framework} as h; print(h.mpi_built())"],
                             capture_output=True, text=True, timeout=300).stdout.split()[-1]
        assert str(horovod_has_mpi(image, family)) == own == "True", family
    assert not {m for m in set(sys.modules) - loaded if m.startswith("horovod")}
    assert "libc.so.6" in needed_libraries("/bin/ls")
    assert needed_libraries(__file__) == [] and needed_libraries("/nonexistent") == []


def test_tcmalloc_is_preloaded_into_every_training_process_before_the_users_libraries():
    image = Image(FW, LA, allocator_libraries=(("tcmalloc", "libtcmalloc_minimal.so.4"),))
    assert "LD_PRELOAD" not in plan(image=image).env                          # the default: the C library's
    for launcher, nodes_ in (("native", 1), ("horovod", 2), ("mpi", 1)):
        p = plan(image=image, MEMORY_ALLOCATOR="tcmalloc", LAUNCHER=launcher, NPROC_PER_NODE=2,
                 LD_PRELOAD="/opt/mine.so", **({"NUM_NODES": 2, "ROLE": "master", "MASTER_ADDR": "m"}
                                               if nodes_ > 1 else {}))
        for spec in plan_processes(p, at(0, nodes(nodes_))):
            assert spec.env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4 /opt/mine.so", (launcher, spec.argv)
    with pytest.raises(ConfigError, match=r"^MEMORY_ALLOCATOR='tcmalloc': not in this image; allowed here: system$"):
        plan(MEMORY_ALLOCATOR="tcmalloc")
