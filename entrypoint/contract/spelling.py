"""Variables that look like the contract's but are not: a misspelled FRAMEWORK would
otherwise train with the default and exit 0. Pure: the environment in, one line per
suspect out.

A name is suspect when it is a near miss of a declared one (FRAMWORK, NUM_NODE,
NPROCS_PER_NODE, CHECKPOINTS_DIR, a lower-case framework), a known alias from another
launcher (NNODES, MASTER_HOST), or an unknown name under a prefix only this contract
uses (ELASTIC_, STRAGGLER_, ...). Everything else is an ordinary variable, the script's
own (LR, BATCH_SIZE) or another system's: those never warn, and names under other
systems' prefixes (CUDA_, NCCL_, OMP_, HF_, KUBERNETES_, SLURM_, AWS_, ...) are not even
compared.
"""

from __future__ import annotations

import difflib
import re

# Other systems' families: their names are theirs to check.
FOREIGN_PREFIXES = (
    "AWS_", "CUDA", "CUDNN_", "DEBIAN_", "DISTTRAIN_", "GLOO_", "GPU_", "HF_", "HOROVOD_", "HOSTNAME", "HUGGINGFACE_",
    "I_MPI_", "JAX_", "JOB_COMPLETION", "KERAS_", "KUBERNETES_", "LC_", "LD_", "LWS_", "MKL_", "MPI_", "MXNET_",
    "NCCL_", "NV", "OMP_", "OMPI_", "OPAL_", "PET_", "PIP_", "PJRT_", "PMI", "PMIX_", "PYTHON", "PYTORCH_", "SLURM_",
    "SM_", "TF_", "TORCH", "TPU_", "TRANSFORMERS_", "VIRTUAL_ENV", "WANDB_", "XDG_", "XLA_FLAGS",
)
# Kubernetes' (and Docker links') variables for each service: a Service named `master` gives
# MASTER_SERVICE_HOST, MASTER_SERVICE_PORT, MASTER_PORT_29500_TCP_ADDR, ...
SERVICE_RE = re.compile(r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$")
# Names that schedulers and launchers set, which this contract reads on its own.
FOREIGN_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_NAME",
                 "POD_NAME", "POD_IP", "HOST_IP", "JOB_INDEX", "JOBSET_NAME", "REPLICATED_JOB_NAME",
                 "CLUSTER_SPEC", "HOME", "PATH", "PWD", "USER", "SHELL", "TERM", "LANG", "TMPDIR", "SHLVL",
                 "OLDPWD", "HOST", "LOGNAME", "MAIL", "TZ", "_"}
# Names the entrypoint sets for its processes: a rank that runs the entrypoint again (under
# mpirun) or a script that reads them sees them, and must not be told they are mistakes.
OWN_OUTPUTS = {"DP_SIZE"}
# Names only this contract's variables begin with: an unknown one is a mistake.
# (Not TRAIN_, SYNC_, CHECKPOINT_ or S3_: scripts name their own settings so.)
CONTRACT_PREFIXES = ("ELASTIC_", "STRAGGLER_", "HANG_", "RDZV_", "GRACE_", "PEER_", "PARALLEL_", "MASTER_",
                     "JOB_SECRET")
# Other launchers' names for the contract's variables.
ALIASES = {"NNODES": "NUM_NODES", "NUM_NODE": "NUM_NODES", "NODES": "NUM_NODES", "NPROC": "NPROC_PER_NODE",
           "NPROCS": "NPROC_PER_NODE", "NPROC_PER_HOST": "NPROC_PER_NODE", "MASTER_HOST": "MASTER_ADDR",
           "MASTER_IP": "MASTER_ADDR", "MASTER_ADDRESS": "MASTER_ADDR", "DATASET_DIR": "DATA_DIR",
           "CKPT_DIR": "CHECKPOINT_DIR", "FRAMEWORKS": "FRAMEWORK", "MODE": "TRAIN_MODE"}
CUTOFF = 0.85              # difflib's ratio: FRAMWORK/FRAMEWORK 0.94; NODE_NAME/NODE_RANK 0.78


def suspects(env: dict[str, str], declared: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """(name, the declared name it likely means, or None) for each variable of `env` that
    looks like a declared name but is not one, in name order."""
    upper = {name.upper(): name for name in declared}
    found = []
    for name in sorted(env):
        if name in declared or name in FOREIGN_NAMES or name in OWN_OUTPUTS or name.upper().startswith(FOREIGN_PREFIXES) \
                or SERVICE_RE.match(name):
            continue
        likely = _likely(name, upper)
        if likely or name.startswith(CONTRACT_PREFIXES):
            found.append((name, likely))
    return found


def describe(name: str, likely: str | None) -> str:
    guess = f"; did you mean {likely}?" if likely else " (`disttrain variables` lists them)"
    return f"{name} is not a variable of this image{guess}"


def _likely(name: str, upper: dict[str, str]) -> str | None:
    key = name.upper()
    if key in upper:                                   # framework=pytorch
        return upper[key]
    if key in ALIASES and ALIASES[key] in upper.values():
        return ALIASES[key]
    if len(key) < 5:
        return None
    found = difflib.get_close_matches(key, list(upper), n=1, cutoff=CUTOFF)
    return upper[found[0]] if found else None
