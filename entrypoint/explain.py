"""The dry run (`--dry-run`, EXPLAIN=1): the launch plan in words, and the processes it
would start, before any rendezvous. Pure."""

from __future__ import annotations

import shlex

from .contract.grad_sync import describe
from .job.placement import NodeInfo, Placement
from .plan import NodePlan
from .running.specs import ProcessSpec


def assumed_placement(plan: NodePlan) -> Placement:
    """For EXPLAIN before rendezvous: every node like this one, ports as placeholders."""
    c = plan.config
    count = c.num_nodes if plan.mode == "distributed" and not c.elastic else 1
    nodes = []
    for rank in range(count):
        ports = plan.launcher.ports_needed(master=rank == 0)
        addr = c.master_addr if rank == 0 else f"<node {rank} address>"
        nodes.append(NodeInfo(rank, addr, plan.nproc, tuple(range(20000 + 100 * rank, 20000 + 100 * rank + ports))))
    rank = plan.direct.rank if plan.direct else (c.node_rank or 0)
    return Placement(rank, tuple(nodes), iface=c.net_ifname, master_port=c.master_port,
                     server_addr=c.master_addr, server_port=plan.launcher.server_port)


def watches(c) -> str:
    """What the node watches besides its processes (docs/operations.md, hangs and stragglers)."""
    hang = f"a hang after HANG_TIMEOUT={c.hang_timeout}s without progress (exit 124)" if c.hang_timeout else \
        "no hangs (HANG_TIMEOUT=0)"
    slow = (f"stragglers at {c.straggler_factor:g}x the others' median for {c.straggler_window}s"
            if c.straggler_factor else "no stragglers (STRAGGLER_FACTOR=0)")
    return f"{hang}; {slow}"


def control_plane(plan: NodePlan) -> str:
    """Who can talk to the job's control plane (docs/security.md)."""
    c = plan.config
    if c.job_store:
        if c.job_store_cert:
            return ("TLS to etcd with a client certificate (JOB_STORE_CERT): only nodes with a certificate etcd "
                    "trusts reach the job store and the rendezvous; not covered: the workers' own torch.distributed "
                    "store (served by global rank 0's process, on every interface of its node)")
        how = "over TLS (JOB_STORE_CA) without a client certificate" if c.job_store_ca else "in plain HTTP"
        return (f"open: JOB_STORE speaks to etcd {how}: anyone who reaches etcd's client port can join or stop "
                f"the job; keep etcd on a network only the job's nodes reach, or give it client certificates "
                f"(JOB_STORE_CERT; docs/rendezvous.md)")
    if not c.has_secret:
        return "open: no JOB_SECRET, anyone who reaches MASTER_PORT can join, stop or run code in the job"
    source = "JOB_SECRET_FILE" if c.job_secret_file else "JOB_SECRET"
    if plan.direct:
        return (f"{source} unused: a rank that {plan.direct.source} started meets the others without this "
                f"image's control plane (through {plan.direct.source} and its process group's own rendezvous), "
                f"which the secret does not cover: keep them on a private network; the secret is kept out of "
                f"the rank's environment")
    still_open = plan.launcher.open_despite_secret()
    return (f"TLS with {source}: the job store and torchrun's rendezvous take only this job's nodes"
            + (f"; not covered: {'; '.join(still_open)}" if still_open else ""))


def credentials_source(env: dict[str, str]) -> str:
    """Where boto3 will find the credentials, by the variables' names only (never a value)."""
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" + (" + AWS_SESSION_TOKEN" if env.get("AWS_SESSION_TOKEN") else "")
    if env.get("AWS_ROLE_ARN") and env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return "web identity (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE: EKS/IRSA)"
    if env.get("AWS_PROFILE"):
        return f"AWS_PROFILE={env['AWS_PROFILE']} (the shared files)"
    return "boto3's chain (the shared files, a container or instance role)"


def storage_lines(c, env: dict[str, str]) -> list[str]:
    """The buckets and the node's folders for them (docs/storage.md)."""
    if not (c.data_url or c.checkpoint_url):
        return []
    lines = []
    if c.data_url:
        lines.append(f"  data:        {c.data_url} -> {c.data_dir}: staged once per node before the ranks start "
                     f"(files cached with the same size and ETag are kept)")
    if c.checkpoint_url:
        lines.append(f"  checkpoints: {c.checkpoint_dir} -> {c.checkpoint_url}: the newest complete checkpoint "
                     f"fetched before the ranks start; each finished file uploaded in the background, flushed "
                     f"at the end (GRACE_PERIOD={c.grace_period}s after a stop)")
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "AWS S3"
    lines.append(f"  store:       {endpoint}; credentials: {credentials_source(env)}")
    return lines


def explain(plan: NodePlan, processes: list[ProcessSpec] | None, base_env: dict[str, str]) -> str:
    c = plan.config
    lines = [f"disttrain launch plan ({plan.mode})",
             f"  framework:   {c.framework}    launcher: {c.launcher}    sync: {c.sync_mode}    "
             f"parallel: {c.parallel_mode} (tp={plan.env.get('TP_SIZE')}, dp={plan.env.get('DP_SIZE')})",
             f"  node:        role={c.role} node_rank={c.node_rank if c.node_rank is not None else 'at rendezvous'} "
             f"nodes={c.num_nodes if not c.elastic else f'{c.min_nodes}:{c.max_nodes}'} "
             f"processes/node={plan.nproc} world={plan.launcher.world_text}",
             f"  accelerator: {plan.accelerator.kind}"
             + (f", PJRT_DEVICE={plan.accelerator.pjrt_device}" if plan.accelerator.xla else "")
             + (f"; {plan.hardware.tpu_text()}" if plan.hardware and plan.accelerator.kind == "tpu" else ""),
             f"  starts:      {plan.starts}",
             f"  watches:     {watches(c)}"] + storage_lines(c, base_env)
    lines += [f"  gradients:   {line}" for line in describe(c.grad_sync, c.framework, c.launcher)]
    if plan.rendezvous:
        r = plan.rendezvous
        serves = [what for what, on in (("the job store", r.serve_store), ("Horovod rendezvous", r.horovod_server)) if on]
        lines.append(f"  rendezvous:  job store {r.endpoint}; this node serves: {', '.join(serves) or 'nothing'}; "
                     f"address exchange: {'yes' if r.exchange else 'no'}; timeout {r.timeout}s")
    if plan.rendezvous or (plan.direct and c.has_secret):
        lines.append(f"  control:     {control_plane(plan)}")
    for source, value in sorted(c.sources.items()):
        lines.append(f"  from scheduler: {source} <- {value}")
    for warning in plan.warnings:
        lines.append(f"  WARNING: {warning}")
    if processes is not None:
        lines.append("  processes:" + (" (assuming every node looks like this one)" if plan.mode == "distributed" else ""))
        lines += [f"    {note}" for note in plan.launcher.dry_run_notes()]
        for p in processes:
            keys = sorted(k for k in p.env if base_env.get(k) != p.env[k])
            shown = " ".join(f"{k}={shlex.quote(p.env[k])}" for k in keys if k != "TF_CONFIG")
            lines.append(f"    [{p.label}]{'' if p.critical else ' (server)'} {' '.join(shlex.quote(a) for a in p.argv)}")
            lines.append(f"        env: {shown}")
            if "TF_CONFIG" in p.env:
                lines.append(f"        TF_CONFIG={p.env['TF_CONFIG']}")
    return "\n".join(lines)
