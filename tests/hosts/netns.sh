#!/usr/bin/env bash
# Several "hosts" on one machine: network namespaces on a bridge, each with
# an address of its own, for jobs that must cross a network interface
# rather than loopback (braid's tcp ranks started by hand; mpirun with a
# hostfile). Needs root (CAP_NET_ADMIN), iproute2 and util-linux.
#
#   tests/hosts/netns.sh up K      # K hosts: namespaces ${PREFIX}0.., with
#                                  # addresses $NET.1 .. $NET.K
#   tests/hosts/netns.sh down      # ends their processes, removes them
#   tests/hosts/netns.sh probe     # fails where namespaces cannot be made
#   tests/hosts/netns.sh rsh [OPTS] HOST CMD...
#                                  # runs CMD on HOST ($NET.i): mpirun's
#                                  # rsh agent (--mca plm_rsh_agent)
#
# BRAID_HOSTS_PREFIX (default bh) and BRAID_HOSTS_NET (default 10.77.0,
# a /24) tell sets apart, so that several can exist at once. The bridge
# ${PREFIX}-br in this namespace has $NET.254, so a launcher here (mpirun)
# reaches its daemons on the hosts.
set -euo pipefail

PREFIX=${BRAID_HOSTS_PREFIX:-bh}
NET=${BRAID_HOSTS_NET:-10.77.0}
BRIDGE=$PREFIX-br

up() {
    local k=$1
    down
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 0; i < k; i++)); do
        local ns=$PREFIX$i
        ip netns add "$ns"
        ip link add "$ns-v" type veth peer name eth0 netns "$ns"
        ip link set "$ns-v" master "$BRIDGE" up
        ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$NET.254"
    done
}

# Ends every process on the hosts (as a machine's end would), then
# removes them; also a host whose name is gone but whose link stayed (a
# process of an earlier run kept its namespace alive).
down() {
    local ns link
    for ns in $(ip netns list | awk '{print $1}'); do
        if [[ $ns =~ ^$PREFIX[0-9]+$ ]]; then
            ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
            ip netns del "$ns"
        fi
    done
    for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
        if [[ $link =~ ^$PREFIX[0-9]+-v$ ]]; then
            ip link del "$link" 2>/dev/null || true
        fi
    done
    ip link del "$BRIDGE" 2>/dev/null || true
}

# mpirun calls its agent as `AGENT [options] HOST CMD...`; HOST is one of
# the hostfile's addresses. Each host also gets a name of its own (its
# address), as MPI's daemons report it: a UTS namespace beside the network
# one.
rsh() {
    while [[ $# -gt 0 && $1 == -* ]]; do shift; done
    local host=$1
    shift
    local i=${host##*.}
    exec ip netns exec "$PREFIX$((i - 1))" unshare --uts /bin/sh -c "hostname $host && $*"
}

# Whether this machine can make hosts at all: a network namespace (root,
# CAP_NET_ADMIN) and, in it, a UTS namespace (CAP_SYS_ADMIN; the rsh agent
# and slurm.sh give each host its name).
probe() {
    ip netns add "${PREFIX}probe"
    local ok=0
    ip netns exec "${PREFIX}probe" unshare --uts true || ok=$?
    ip netns del "${PREFIX}probe"
    return $ok
}

case "${1:-}" in
    probe) probe ;;
    up) up "${2:-3}" ;;
    down) down ;;
    rsh) shift; rsh "$@" ;;
    *) echo "usage: $0 up K | down | probe | rsh HOST CMD..." >&2; exit 2 ;;
esac
