"""The environment contract: every variable validated, one clear line per bad value."""

import pytest

from entrypoint.contract.config import VARIABLE_NAMES, ConfigError, load_config
from entrypoint.contract.manifest import Image
from tests.conftest import ROOT

FRAMEWORKS = ["pytorch", "tensorflow", "keras"]
LAUNCHERS = ["native", "horovod", "mpi"]


def config(**env):
    return load_config({k: str(v) for k, v in env.items()}, Image(FRAMEWORKS, LAUNCHERS))


def error(**env) -> str:
    with pytest.raises(ConfigError) as info:
        config(**env)
    message = str(info.value)
    assert "\n" not in message
    return message


DISTRIBUTED = dict(TRAIN_MODE="distributed", NUM_NODES=2, MASTER_ADDR="master")


def test_defaults_are_a_local_pytorch_run():
    c = config()
    assert (c.framework, c.train_mode, c.role, c.node_rank, c.launcher) == ("pytorch", "local", "master", 0, "native")
    assert c.master_port == 29500 and c.horovod_port == 29501 and c.entrypoint == "/app/code/train.py"
    assert c.data_dir == "/app/data" and c.nproc_per_node is None and c.rdzv_timeout == 300


def test_distributed_is_implied_by_num_nodes_and_role():
    c = config(NUM_NODES=2, ROLE="worker", MASTER_ADDR="10.0.0.1")
    assert c.train_mode == "distributed" and c.role == "worker" and c.node_rank is None


def test_role_from_node_rank():
    assert config(**DISTRIBUTED, NODE_RANK=0).role == "master"
    assert config(**DISTRIBUTED, NODE_RANK=1).role == "worker"


@pytest.mark.parametrize("env, names, allowed", [
    (dict(FRAMEWORK="jax"), "FRAMEWORK='jax'", "pytorch, tensorflow, keras"),
    (dict(TRAIN_MODE="cluster"), "TRAIN_MODE='cluster'", "local, distributed"),
    (dict(ROLE="boss", NUM_NODES=2, MASTER_ADDR="m"), "ROLE='boss'", "master, worker"),
    (dict(NUM_NODES="two"), "NUM_NODES='two'", "integer >= 1"),
    (dict(NUM_NODES=0), "NUM_NODES='0'", "integer >= 1"),
    (dict(NODE_RANK=-1, **DISTRIBUTED), "NODE_RANK='-1'", "integer >= 0"),
    (dict(NODE_RANK=5, **DISTRIBUTED), "NODE_RANK='5'", "< NUM_NODES (2)"),
    (dict(MASTER_ADDR="bad host!", **{k: v for k, v in DISTRIBUTED.items() if k != "MASTER_ADDR"}),
     "MASTER_ADDR='bad host!'", "host name or IP"),
    (dict(MASTER_PORT=70000), "MASTER_PORT='70000'", "<= 65535"),
    (dict(MASTER_PORT="http"), "MASTER_PORT='http'", "integer"),
    (dict(NPROC_PER_NODE=0), "NPROC_PER_NODE='0'", "integer >= 1"),
    (dict(PARALLEL_MODE="pipeline"), "PARALLEL_MODE='pipeline'", "data_parallel, model_parallel, hybrid"),
    (dict(TP_SIZE=2), "TP_SIZE='2'", "data_parallel has no model-parallel"),
    (dict(TP_SIZE="x", PARALLEL_MODE="hybrid"), "TP_SIZE='x'", "integer >= 1"),
    (dict(LAUNCHER="deepspeed"), "LAUNCHER='deepspeed'", "native, horovod, mpi"),
    (dict(SYNC_MODE="eventually"), "SYNC_MODE='eventually'", "sync, async"),
    (dict(SYNC_MODE="async", LAUNCHER="horovod"), "SYNC_MODE='async'", "allowed: sync"),
    (dict(SYNC_PERIOD=0), "SYNC_PERIOD='0'", "integer >= 1"),
    (dict(GRAD_COMPRESSION="zip"), "GRAD_COMPRESSION='zip'", "none, fp16, bf16, powersgd"),
    (dict(GRAD_COMPRESSION="bf16", LAUNCHER="horovod"), "GRAD_COMPRESSION='bf16': not built for FRAMEWORK=pytorch "
     "LAUNCHER=horovod", "allowed: none, fp16 (bf16: pytorch/native, pytorch/mpi)"),
    (dict(GRAD_ACCUMULATION=2, FRAMEWORK="tensorflow", LAUNCHER="horovod"), "GRAD_ACCUMULATION=2: not built for "
     "FRAMEWORK=tensorflow LAUNCHER=horovod", "allowed: 1"),
    (dict(GRAD_COMPRESSION="fp16", FRAMEWORK="keras"), "GRAD_COMPRESSION='fp16': not built for FRAMEWORK=keras "
     "LAUNCHER=native", "allowed: none"),
    (dict(GRAD_COMPRESSION="powersgd", SYNC_MODE="async"), "GRAD_COMPRESSION='powersgd'", "allowed with "
     "SYNC_MODE=async: none"),
    (dict(GRAD_ACCUMULATION=0), "GRAD_ACCUMULATION='0'", "integer >= 1"),
    (dict(GRAD_ACCUMULATION=4, FRAMEWORK="tensorflow"), "GRAD_ACCUMULATION=4: not built for FRAMEWORK=tensorflow",
     "allowed: 1"),
    (dict(GRAD_BUCKET_MB=0), "GRAD_BUCKET_MB='0'", "integer >= 1"),
    (dict(GRAD_BUCKET_MB=8, FRAMEWORK="tensorflow"), "GRAD_BUCKET_MB=8: not built for "
     "FRAMEWORK=tensorflow LAUNCHER=native", "allowed: unset"),
    (dict(POWERSGD_RANK=0), "POWERSGD_RANK='0'", "integer >= 1"),
    (dict(POWERSGD_WARMUP=1), "POWERSGD_WARMUP='1'", "integer >= 2"),
    (dict(NUM_PS=0), "NUM_PS='0'", "integer >= 1"),
    (dict(MIN_NODES=3, MAX_NODES=2, TRAIN_MODE="distributed", MASTER_ADDR="m", ROLE="master"),
     "MIN_NODES='3'", "<= MAX_NODES"),
    (dict(MIN_NODES=1, TRAIN_MODE="distributed", MASTER_ADDR="m", ROLE="master"), "MIN_NODES='1'", "MAX_NODES"),
    (dict(MAX_RESTARTS=-1), "MAX_RESTARTS='-1'", "integer >= 0"),
    (dict(MAX_RESTARTS=2, LAUNCHER="horovod"), "MAX_RESTARTS='2'", "allowed here: 0"),
    (dict(ELASTIC_LAST_CALL=5, NUM_NODES=2, ROLE="master", MASTER_ADDR="m"), "ELASTIC_LAST_CALL='5'",
     "only elastic jobs use it"),
    (dict(ELASTIC_DEAD_AFTER=1, MIN_NODES=1, MAX_NODES=2, ROLE="master", MASTER_ADDR="m"),
     "ELASTIC_DEAD_AFTER='1'", "integer >= 2"),
    (dict(RDZV_TIMEOUT=0), "RDZV_TIMEOUT='0'", "integer >= 1"),
    (dict(PEER_TIMEOUT=1), "PEER_TIMEOUT='1'", "integer >= 2"),
    (dict(GRACE_PERIOD="soon"), "GRACE_PERIOD='soon'", "integer >= 0"),
    (dict(RUN_ID="a b"), "RUN_ID='a b'", "letters, digits"),
    (dict(HOROVOD_PORT=29500), "HOROVOD_PORT='29500'", "must differ from MASTER_PORT"),
    (dict(NODE_ADDR="@@"), "NODE_ADDR='@@'", "host name or IP"),
    (dict(NET_IFNAME="eth0; rm"), "NET_IFNAME='eth0; rm'", "interface name"),
    (dict(WORKER_PORT_BASE=80), "WORKER_PORT_BASE='80'", "integer >= 1024"),
    (dict(HOSTFILE="/h"), "HOSTFILE='/h'", "LAUNCHER=mpi"),
    (dict(IB_HCA="mlx5 0"), "IB_HCA='mlx5 0'", "mlx5_0:1"),
    (dict(GPU_DIRECT_RDMA="maybe"), "GPU_DIRECT_RDMA='maybe'", "0, 1"),
    (dict(P2P_DISABLE="2"), "P2P_DISABLE='2'", "0, 1"),
    (dict(COMM_DEBUG="loud"), "COMM_DEBUG='loud'", "off, warn, info, trace"),
    (dict(EXPLAIN="please"), "EXPLAIN='please'", "0, 1"),
])
def test_bad_value_names_variable_value_and_allowed(env, names, allowed):
    message = error(**env)
    assert names in message and allowed in message


def reference_page() -> str:
    return (ROOT / "docs" / "configuration.md").read_text()


def test_every_variable_is_documented_in_the_configuration_reference():
    missing = [name for name in VARIABLE_NAMES if f"`{name}`" not in reference_page()]
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_the_reference_shows_the_declared_defaults():
    """A default is written once, in VARIABLES; the reference's table must show that one."""
    import re

    from entrypoint.contract.config import VARIABLES

    shown = {}
    for line in reference_page().splitlines():
        match = re.match(r"^\| ((?:`[A-Za-z0-9_]+`(?:, )?)+) \| ([^|]*) \|", line)
        if match:
            for name in re.findall(r"`([A-Za-z0-9_]+)`", match.group(1)):
                shown.setdefault(name, match.group(2).strip())
    wrong = {v.name: (v.default, shown.get(v.name)) for v in VARIABLES
             if shown.get(v.name) != (f"`{v.default}`" if v.default is not None else "—")}
    assert not wrong, wrong


def test_the_configuration_reference_is_not_stale():
    """docs/configuration.md's table is generated from VARIABLES; this fails when someone
    changed a declaration and not the page (fix: python -m entrypoint.contract.reference)."""
    from entrypoint.contract import reference
    page = reference_page()
    assert reference.render(page) == page, "docs/configuration.md is stale: run python -m entrypoint.contract.reference"
    assert reference.main(["--check"]) == 0


def test_a_stale_reference_is_caught():
    from entrypoint.contract import reference
    page = reference_page()
    stale = page.replace("`29500`", "`29400`", 1)
    assert stale != page and reference.render(stale) == page


def test_empty_values_count_as_unset():
    c = config(FRAMEWORK="", NUM_NODES="", MASTER_PORT=" ", GPU_DIRECT_RDMA="")
    assert (c.framework, c.num_nodes, c.master_port, c.nccl_env) == ("pytorch", 1, 29500, {})


def test_mxnet_is_refused_naming_the_variant_that_has_it():
    message = error(FRAMEWORK="mxnet")
    assert message.startswith("FRAMEWORK='mxnet': ") and "cpu-mxnet" in message
    assert "allowed here: pytorch, tensorflow, keras" in message


def test_the_variant_named_for_mxnet_carries_it():
    from buildsys.matrix import load_matrix
    from entrypoint.contract.config import MXNET_VARIANT
    from tests.conftest import ROOT

    assert "mxnet" in load_matrix(ROOT / "matrix.yaml").variants[MXNET_VARIANT].frameworks()


def test_mxnet_launchers_are_parameter_servers_or_horovod():
    with_mxnet = FRAMEWORKS + ["mxnet"]
    assert load_config({"FRAMEWORK": "mxnet", "LAUNCHER": "horovod"}, Image(with_mxnet, LAUNCHERS)).launcher == "horovod"
    c = load_config({"FRAMEWORK": "mxnet", "SYNC_MODE": "async", "NUM_PS": "2"}, Image(with_mxnet, LAUNCHERS))
    assert (c.launcher, c.sync_mode, c.num_ps) == ("native", "async", 2)
    with pytest.raises(ConfigError) as info:
        load_config({"FRAMEWORK": "mxnet", "LAUNCHER": "mpi"}, Image(with_mxnet, LAUNCHERS))
    assert str(info.value) == ("LAUNCHER='mpi': FRAMEWORK=mxnet runs on MXNet's parameter servers or Horovod; "
                               "allowed: native, horovod")


def test_framework_not_in_this_image():
    with pytest.raises(ConfigError, match="not in this image; allowed here: pytorch"):
        load_config({"FRAMEWORK": "tensorflow"}, Image(["pytorch"], LAUNCHERS))


def test_distributed_needs_master_addr():
    assert "MASTER_ADDR is not set" in error(TRAIN_MODE="distributed", NUM_NODES=2, ROLE="worker")


def test_distributed_needs_role_or_node_rank():
    assert "ROLE is not set" in error(TRAIN_MODE="distributed", NUM_NODES=2, MASTER_ADDR="m")


def test_master_is_node_zero():
    assert "the master is node 0" in error(**DISTRIBUTED, ROLE="master", NODE_RANK=1)
    assert "0 is the master's rank" in error(**DISTRIBUTED, ROLE="worker", NODE_RANK=0)


def test_local_mode_runs_one_node():
    assert "TRAIN_MODE=local runs one node" in error(TRAIN_MODE="local", NUM_NODES=2)


def test_hybrid_needs_tp_size():
    assert "TP_SIZE is not set" in error(PARALLEL_MODE="hybrid")


def test_model_parallel_is_pytorch_only():
    assert "allowed: data_parallel" in error(FRAMEWORK="tensorflow", PARALLEL_MODE="hybrid", TP_SIZE=2)


def test_elastic_is_torchruns_for_pytorch_and_horovods_for_pytorch_tensorflow_and_keras():
    elastic = dict(TRAIN_MODE="distributed", MASTER_ADDR="m", ROLE="master", MIN_NODES=1, MAX_NODES=3)
    assert "elastic training needs FRAMEWORK=pytorch with LAUNCHER=native (torchrun), or " \
           "FRAMEWORK=pytorch|tensorflow|keras with LAUNCHER=horovod (hvd.elastic), got FRAMEWORK=tensorflow " \
           "LAUNCHER=native" in error(FRAMEWORK="tensorflow", **elastic)
    assert "got FRAMEWORK=pytorch LAUNCHER=mpi" in error(LAUNCHER="mpi", HOSTFILE="/h", **elastic)
    for framework in ("tensorflow", "keras"):
        assert config(FRAMEWORK=framework, LAUNCHER="horovod", **elastic).elastic


def test_multi_node_mpi_needs_a_hostfile():
    assert "HOSTFILE is not set" in error(LAUNCHER="mpi", **DISTRIBUTED, ROLE="master")


def test_nccl_tuning_variables_become_nccl_settings():
    c = config(IB_HCA="mlx5_0:1", GPU_DIRECT_RDMA=1, P2P_DISABLE=1, COMM_DEBUG="info")
    assert c.nccl_env == {"NCCL_IB_HCA": "mlx5_0:1", "NCCL_NET_GDR_LEVEL": "3", "NCCL_P2P_DISABLE": "1",
                          "NCCL_DEBUG": "INFO"}


def test_nccl_variable_conflict_is_an_error():
    message = error(IB_HCA="mlx5_0:1", NCCL_IB_HCA="mlx5_1:1")
    assert "IB_HCA='mlx5_0:1' conflicts with NCCL_IB_HCA='mlx5_1:1'" in message


def test_an_interface_variable_that_does_not_select_net_ifname_is_an_error():
    assert error(NET_IFNAME="lo", NCCL_SOCKET_IFNAME="eth0") == (
        "NET_IFNAME='lo' conflicts with NCCL_SOCKET_IFNAME='eth0', which does not select it; set only one of them")
    assert "GLOO_SOCKET_IFNAME='eth1'" in error(NET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth1")
    assert "NCCL_SOCKET_IFNAME='^lo,docker'" in error(NET_IFNAME="lo", NCCL_SOCKET_IFNAME="^lo,docker")
    for agreeing in ("eth0", "eth", "=eth0", "^docker,lo", "ib,eth"):      # NCCL's selector syntax
        config(NET_IFNAME="eth0", NCCL_SOCKET_IFNAME=agreeing)
    config(NCCL_SOCKET_IFNAME="eth0")                                         # alone, it is NCCL's own


def test_script_arguments_pass_through():
    c = load_config({}, Image(FRAMEWORKS, LAUNCHERS), ("--steps", "5"))
    assert c.script_args == ("--steps", "5")


# --------------------------------------------------------------------------- JOB_STORE
ON_ETCD = dict(JOB_STORE="etcd://e1:2379,10.0.0.2:2379", MIN_NODES=1, MAX_NODES=3, MAX_RESTARTS=3)


def test_a_job_on_etcd_needs_no_master_role_or_address():
    c = config(**ON_ETCD)
    assert c.job_store == ("http://e1:2379", "http://10.0.0.2:2379")
    assert (c.train_mode, c.role, c.node_rank, c.master_addr) == ("distributed", "peer", None, "")
    tls = config(**ON_ETCD, JOB_STORE_CA="/ca.pem", JOB_STORE_CERT="/c.pem", JOB_STORE_KEY="/k.pem")
    assert tls.job_store == ("https://e1:2379", "https://10.0.0.2:2379") and tls.job_store_key == "/k.pem"
    fixed = config(JOB_STORE="etcd://e1:2379", NUM_NODES=2)
    assert (fixed.train_mode, fixed.role, fixed.elastic) == ("distributed", "peer", False)


@pytest.mark.parametrize("env, names, allowed", [
    (dict(JOB_STORE="etcd:/e1:2379"), "JOB_STORE='etcd:/e1:2379'", "etcd://HOST:PORT[,HOST:PORT...]"),
    (dict(JOB_STORE="http://e1:2379"), "JOB_STORE='http://e1:2379'", "etcd://HOST:PORT[,HOST:PORT...]"),
    (dict(JOB_STORE="etcd://e1"), "member 'e1' is not HOST:PORT", "etcd://HOST:PORT[,HOST:PORT...]"),
    (dict(JOB_STORE="etcd://e1:2379,e1:2379"), "named twice", "etcd://HOST:PORT[,HOST:PORT...]"),
    (dict(JOB_STORE="etcd://e1:70000"), "member 'e1:70000'", "a port 1-65535"),
    (dict(ROLE="master"), "ROLE='master': not used with JOB_STORE", "unset it"),
    (dict(MASTER_ADDR="10.0.0.1"), "MASTER_ADDR='10.0.0.1': not used with JOB_STORE", "unset it"),
    (dict(NODE_RANK="0"), "NODE_RANK='0': not used with JOB_STORE", "unset it"),
    (dict(TRAIN_MODE="local"), "TRAIN_MODE='local'", "allowed with it: distributed"),
    (dict(MIN_NODES="", MAX_NODES=""), "NUM_NODES='1'", "2 or more, or MIN_NODES and MAX_NODES"),
    (dict(LAUNCHER="horovod", MAX_RESTARTS=0), "LAUNCHER=horovod", "PyTorch under torchrun"),
    (dict(FRAMEWORK="tensorflow", MIN_NODES="", MAX_NODES="", MAX_RESTARTS=0, NUM_NODES=2), "FRAMEWORK=tensorflow",
     "PyTorch under torchrun"),
    (dict(JOB_SECRET="0123456789abcdef0123456789abcdef"), "JOB_SECRET with JOB_STORE", "secure etcd itself with client certificates"),
    (dict(JOB_STORE_CERT="/c.pem"), "JOB_STORE_CERT='/c.pem'", "set JOB_STORE_KEY too"),
    (dict(JOB_STORE_KEY="/k.pem"), "JOB_STORE_KEY='/k.pem'", "set JOB_STORE_CERT too"),
    (dict(JOB_STORE_CERT="/c.pem", JOB_STORE_KEY="/k.pem"), "JOB_STORE_CERT='/c.pem'", "set JOB_STORE_CA"),
    (dict(JOB_STORE_CA="ca.pem"), "JOB_STORE_CA='ca.pem'", "an absolute path"),
    (dict(JOB_STORE="", JOB_STORE_CA="/ca.pem"), "JOB_STORE_CA='/ca.pem'", "only JOB_STORE uses it"),
])
def test_bad_job_store_settings_are_one_line(env, names, allowed):
    message = error(**{**ON_ETCD, **env})
    assert names in message and allowed in message, message



def test_gradient_strategies_reach_the_ranks_as_the_framework_spells_them():
    from entrypoint.contract.grad_sync import describe
    c = config(GRAD_COMPRESSION="powersgd", POWERSGD_RANK=2, GRAD_ACCUMULATION=4, GRAD_BUCKET_MB=50)
    assert c.grad_sync.env() == {"GRAD_COMPRESSION": "powersgd", "GRAD_ACCUMULATION": "4", "POWERSGD_RANK": "2",
                                 "POWERSGD_WARMUP": "10", "GRAD_BUCKET_MB": "50"}
    said = describe(c.grad_sync, c.framework, c.launcher)
    assert len(said) == 3 and "powerSGD_hook" in said[0] and "no_sync" in said[1] and "bucket_cap_mb" in said[2]
    assert config().grad_sync.default and describe(config().grad_sync, "pytorch", "native") == []
    hvd = config(GRAD_COMPRESSION="fp16", GRAD_BUCKET_MB=8, LAUNCHER="horovod")
    assert "hvd.Compression.fp16" in describe(hvd.grad_sync, "pytorch", "horovod")[0]
    from disttrain.gradsync import bf16_compress_hook_on_gloo           # the hook a Gloo job gets, by its name
    bf16 = describe(config(GRAD_COMPRESSION="bf16").grad_sync, "pytorch", "native")[0]
    assert "bf16_compress_hook " in bf16 and bf16_compress_hook_on_gloo.__name__ in bf16


def test_a_training_process_reads_back_the_strategies_the_entrypoint_passed():
    """disttrain.gradsync reads GradSync.from_env: what env() wrote comes back equal; unset
    variables are the defaults; a value that is no number names its variable."""
    from disttrain.gradsync_settings import GradSync
    for c in (config(GRAD_COMPRESSION="powersgd", POWERSGD_RANK=2, POWERSGD_WARMUP=5, GRAD_BUCKET_MB=50),
              config(GRAD_ACCUMULATION=4), config()):
        assert GradSync.from_env(c.grad_sync.env()) == c.grad_sync
    assert GradSync.from_env({}) == GradSync() and GradSync().default
    with pytest.raises(ValueError, match="GRAD_ACCUMULATION='four' is not a whole number"):
        GradSync.from_env({"GRAD_ACCUMULATION": "four"})


def test_the_gradient_strategies_page_shows_the_table_the_entrypoint_enforces():
    """docs/gradient-sync.md's support table is grad_sync.table(), the rule's own table
    (fix: paste the output of python -c 'from entrypoint.contract.grad_sync import table; print(table())')."""
    from entrypoint.contract.grad_sync import table
    page = (ROOT / "docs" / "gradient-sync.md").read_text()
    shown = page.split("<!-- SUPPORT -->\n", 1)[1].split("\n<!-- /SUPPORT -->", 1)[0]
    assert shown == table()
