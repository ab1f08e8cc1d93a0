#!/usr/bin/env bash
# A Slurm cluster on the hosts that netns.sh makes: slurmctld here (on the
# bridge's address), one slurmd on each host, every file of it (config,
# state, logs, pid files) in DIR, on ports of its own, without munge
# (auth/none), so that it neither needs nor touches a Slurm set up on this
# machine. Needs root and Slurm's daemons (Debian: slurmctld, slurmd,
# slurm-client).
#
#   tests/hosts/slurm.sh up DIR K   # then: SLURM_CONF=DIR/slurm.conf srun ...
#   tests/hosts/slurm.sh down DIR
#
# BRAID_HOSTS_PREFIX and BRAID_HOSTS_NET as for netns.sh: the hosts must be
# up already. Node i is named h<i> and has netns.sh's address $NET.(i+1);
# each slurmd runs in its host's network namespace and in a UTS namespace
# with the node's name as host name (Open MPI tells hosts apart by it).
set -euo pipefail

PREFIX=${BRAID_HOSTS_PREFIX:-bh}
NET=${BRAID_HOSTS_NET:-10.77.0}
# Ports of this set of hosts (several sets may run at once).
OCTET=${NET##*.}
CTLD_PORT=$((16000 + 2 * OCTET))
SLURMD_PORT=$((CTLD_PORT + 1))

up() {
    local dir=$1 k=$2
    down "$dir"
    mkdir -p "$dir/state" "$dir/log"
    local conf=$dir/slurm.conf
    cat >"$conf" <<EOF
ClusterName=braidtest
SlurmctldHost=$(hostname -s)($NET.254)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
ReturnToService=2
SlurmUser=root
SlurmdUser=root
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdSpoolDir=$dir/spool-%n
SlurmdLogFile=$dir/log/slurmd-%n.log
TmpFS=$dir/tmp-%n
NodeName=h[0-$((k - 1))] NodeAddr=$NET.[1-$k] CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 State=UNKNOWN
PartitionName=hosts Nodes=h[0-$((k - 1))] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
    export SLURM_CONF=$conf
    slurmctld -c -f "$conf"
    for ((i = 0; i < k; i++)); do
        mkdir -p "$dir/spool-h$i" "$dir/tmp-h$i"
        nsenter --net="/var/run/netns/$PREFIX$i" unshare --uts \
            /bin/sh -c "hostname h$i && exec slurmd -f '$conf' -N h$i"
    done
    # Up when every node is idle.
    for ((t = 0; t < 300; t++)); do
        if [[ $(sinfo -h -o '%t %D' 2>/dev/null) == "idle $k" ]]; then
            return 0
        fi
        sleep 0.1
    done
    echo "the Slurm nodes did not come up: $(sinfo -h 2>&1)" >&2
    tail -n 5 "$dir"/log/*.log >&2 || true
    return 1
}

# Stops the daemons (SIGKILL after 5 s); netns.sh's down ends whatever
# else still runs on the hosts (slurmstepd, tasks).
down() {
    local dir=$1 f t
    local pids=()
    for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
        [[ -f $f ]] && pids+=("$(cat "$f")")
    done
    [[ ${#pids[@]} -gt 0 ]] || return 0
    kill "${pids[@]}" 2>/dev/null || true
    local p alive
    for ((t = 0; t < 50; t++)); do
        alive=0
        for p in "${pids[@]}"; do
            if kill -0 "$p" 2>/dev/null; then alive=1; fi
        done
        [[ $alive == 1 ]] || break
        sleep 0.1
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
    rm -f "$dir"/*.pid
}

case "${1:-}" in
    up) up "$2" "${3:-3}" ;;
    down) down "$2" ;;
    *) echo "usage: $0 up DIR K | down DIR" >&2; exit 2 ;;
esac
