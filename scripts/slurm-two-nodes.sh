#!/usr/bin/env bash
# A real two-node Slurm on this one machine, for the tests and CI (Debian's slurmctld,
# slurmd, slurm-client and munge; run as root):
#
#   scripts/slurm-two-nodes.sh start DIR   config, spool and logs under DIR; prints
#                                          `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-two-nodes.sh stop DIR    stops what `start` started, by its own PIDs
#
# Nodes node1 and node2 are two `slurmd -N` on 127.0.0.1 and 127.0.0.2 (each its own port),
# so that `sbatch -N2`, `srun` and `scontrol show hostnames` behave as on a cluster. Their
# names must resolve: `start` adds them to /etc/hosts if they are not there.
set -euo pipefail
action=${1:?usage: $0 start|stop DIR}
dir=$(realpath -m "${2:?usage: $0 start|stop DIR}")
nodes=(node1 node2)

stop() {
    for pidfile in "$dir"/slurmd.*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2> /dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2> /dev/null || true
        rm -f "$pidfile"
    done
}

if [ "$action" = stop ]; then stop; exit 0; fi
[ "$action" = start ] || { echo "$0: action must be start or stop, not '$action'" >&2; exit 2; }
for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" > /dev/null || { echo "$0: $tool not found (apt-get install slurmd slurmctld slurm-client munge)" >&2; exit 2; }
done

mkdir -p "$dir/state" "$dir/munge" "$dir/job_scripts"
for k in "${!nodes[@]}"; do
    mkdir -p "$dir/spool/${nodes[$k]}"
    grep -qE "^127\.0\.0\.$((k + 1))\s+${nodes[$k]}(\s|$)" /etc/hosts || echo "127.0.0.$((k + 1)) ${nodes[$k]}" >> /etc/hosts
done

cores=$(nproc)
cat > "$dir/slurm.conf" <<EOF
ClusterName=disttrain
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmctldPort=16817
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=30
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MessageTimeout=20
NodeName=node1 NodeAddr=127.0.0.1 Port=16818 CPUs=$cores Sockets=1 CoresPerSocket=$cores ThreadsPerCore=1 State=UNKNOWN
NodeName=node2 NodeAddr=127.0.0.2 Port=16819 CPUs=$cores Sockets=1 CoresPerSocket=$cores ThreadsPerCore=1 State=UNKNOWN
PartitionName=train Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$dir/slurm.conf"

stop                                                    # a previous start's, if any
munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" \
    --seed-file="$dir/munge/seed" --log-file="$dir/munge/munged.log"
slurmctld -f "$SLURM_CONF" -i
for node in "${nodes[@]}"; do slurmd -f "$SLURM_CONF" -N "$node"; done
for _ in $(seq 60); do
    [ "$(sinfo -h -N -t idle -o %N 2> /dev/null | sort -u | wc -l)" = 2 ] && break
    sleep 0.5
done
sinfo -h -N -t idle -o %N | sort -u | grep -q node2 || { echo "$0: nodes not idle: $(sinfo -N 2>&1)" >&2; stop; exit 1; }
echo "export SLURM_CONF=$SLURM_CONF"
