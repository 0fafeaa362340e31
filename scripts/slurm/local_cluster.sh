#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, to run scripts/slurm/train.sbatch under a real Slurm (notebook 07,
# tests/system/test_slurm.py). Debian's packages (slurmctld, slurmd, slurm-client, munge; 22.05 on Debian 12).
#
#   bash scripts/slurm/local_cluster.sh install          # apt-get the packages if missing (root, Debian/Ubuntu)
#   bash scripts/slurm/local_cluster.sh start  [DIR]     # write DIR/slurm.conf, start munged, slurmctld, slurmd
#   export SLURM_CONF=DIR/slurm.conf                     # then sbatch, squeue, sinfo, scancel talk to it
#   bash scripts/slurm/local_cluster.sh status [DIR]     # sinfo and squeue
#   bash scripts/slurm/local_cluster.sh stop   [DIR]     # cancel its jobs, stop the three daemons
#
# DIR (default $SLURM_LOCAL_DIR, else /tmp/mnist-slurm) holds everything: the config, a munge key and socket of
# its own (the system munge is left alone), state, spool, logs and pid files; nothing under /etc is written and
# no service is enabled. The node is this host (`hostname -s`) with its CPU count (nproc) and about 90% of its
# memory; one partition "local"; no accounting, no cgroups (proctrack/linuxproc, task/none), so it also runs in
# a container. Jobs run as the user who submits them; the daemons run as root (start needs root).
# Exit status: 0 done; 3 this machine cannot run it (the reason is printed: not root, no apt-get, apt failed);
# 1 something failed on the way (the logs in DIR/log say what).
set -u

cmd=${1:-}
dir=${2:-${SLURM_LOCAL_DIR:-/tmp/mnist-slurm}}
conf=$dir/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge)

say() { echo "local_cluster: $*"; }
cannot() { say "$*"; exit 3; }

have_slurm() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null
}

# Daemons live in /usr/sbin, which a non-login shell may not have on PATH.
export PATH="$PATH:/usr/sbin:/sbin"

install() {
    have_slurm && return 0
    [ "${MNIST_NO_SYSTEM_INSTALL:-}" = 1 ] && cannot "MNIST_NO_SYSTEM_INSTALL=1, so Slurm is not installed" \
        "(unset it to let make test apt-get slurmctld, slurmd, slurm-client and munge)"
    command -v apt-get >/dev/null || cannot "Slurm is not installed and apt-get is not available" \
        "(install slurmctld, slurmd, slurm-client and munge with your package manager)"
    [ "$(id -u)" = 0 ] || cannot "Slurm is not installed and installing it needs root:" \
        "sudo apt-get install -y ${PACKAGES[*]}"
    say "installing ${PACKAGES[*]} with apt-get (once)"
    local log=/tmp/local_cluster_apt.log
    # --no-install-recommends: no GUI (sview) or MariaDB client; policy-rc.d (containers) keeps services off
    if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" \
           || { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
                && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"; }
         } >"$log" 2>&1; then
        tail -n 5 "$log"
        cannot "apt-get could not install ${PACKAGES[*]} (log: $log)"
    fi
    have_slurm || cannot "apt-get finished but slurmctld/slurmd/sbatch/munged are still missing (log: $log)"
}

free_port() {  # a free TCP port (the standard 6817/6818 may belong to a real Slurm on this machine)
    python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' 2>/dev/null \
        || echo "$1"
}

running() { [ -f "$dir/$1.pid" ] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }

write_conf() {
    local node cpus mem_kb mem_mb
    node=$(hostname -s)
    cpus=$(nproc)
    mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
    mem_mb=$(( mem_kb / 1024 * 9 / 10 ))  # RealMemory a bit below the total, or slurmd marks the node invalid
    mkdir -p "$dir"/{state,spool,log,munge}
    chmod 755 "$dir" "$dir/munge"  # any user may submit; the key (0400) is what munge keeps secret
    cat >"$conf" <<EOF
# written by scripts/slurm/local_cluster.sh for $node: one node, no accounting, no cgroups
ClusterName=mnistlocal
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port 6817)
SlurmdPort=$(free_port 6818)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
MinJobAge=600
InactiveLimit=0
MailProg=/bin/true
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

start_daemon() {  # NAME COMMAND...: in the background, in its own session, pid recorded
    local name=$1
    shift
    setsid "$@" >>"$dir/log/$name.out" 2>&1 </dev/null &
    echo $! >"$dir/$name.pid"
}

start() {
    [ "$(id -u)" = 0 ] || cannot "start needs root (slurmd runs jobs as their users; munged and slurmd as root)"
    install
    if running slurmctld || running slurmd || running munged; then
        say "already running in $dir (stop it first: bash $0 stop $dir)"
        exit 1
    fi
    write_conf
    getent hosts "$(hostname -s)" >/dev/null \
        || say "warning: $(hostname -s) does not resolve (add it to /etc/hosts): torchrun's rendezvous needs it"
    # munge: a key and a socket of our own
    if [ ! -s "$dir/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$dir/munge/munge.key"
        chmod 400 "$dir/munge/munge.key"
    fi
    start_daemon munged munged --foreground --force --key-file="$dir/munge/munge.key" \
        --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed"
    local i
    for i in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
    [ -S "$dir/munge/munge.socket" ] || { say "munged did not start:"; tail -n 5 "$dir/log/munged".*; stop; exit 1; }
    export SLURM_CONF=$conf
    start_daemon slurmctld slurmctld -D -c -f "$conf"   # -c: a fresh state, no jobs from an earlier run
    start_daemon slurmd slurmd -D -f "$conf" -N "$(hostname -s)"
    # ready when the node is idle (it starts as "unknown", then slurmd registers)
    for i in $(seq 120); do
        if [ "$(sinfo -h -N -o %t 2>/dev/null)" = idle ]; then
            say "up: node $(hostname -s), $(nproc) CPUs, partition local; export SLURM_CONF=$conf"
            return 0
        fi
        if ! running slurmctld || ! running slurmd; then break; fi
        sleep 0.25
    done
    say "the node did not become idle within 30 s; sinfo says: $(sinfo -h -N -o '%t %E' 2>&1)"
    tail -n 5 "$dir"/log/slurmctld.log "$dir"/log/slurmd.log "$dir"/log/*.out 2>/dev/null
    stop
    exit 1
}

stop_pid() {  # NAME: SIGTERM, wait up to 10 s, then SIGKILL
    local name=$1 pid i
    [ -f "$dir/$name.pid" ] || return 0
    pid=$(cat "$dir/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$dir/$name.pid"
}

stop() {
    [ -f "$conf" ] || { say "nothing to stop in $dir"; return 0; }
    export SLURM_CONF=$conf
    if running slurmctld; then
        # jobs first: their slurmstepd processes outlive slurmd
        scancel --full --quiet --partition=local 2>/dev/null
        local i
        for i in $(seq 60); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.25; done
    fi
    stop_pid slurmd
    stop_pid slurmctld
    stop_pid munged
    say "stopped ($dir)"
}

status() {
    export SLURM_CONF=$conf
    local name
    for name in munged slurmctld slurmd; do
        if running "$name"; then say "$name running (pid $(cat "$dir/$name.pid"))"; else say "$name not running"; fi
    done
    running slurmctld || exit 1
    sinfo
    squeue
}

case "$cmd" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: bash $0 install | start [DIR] | status [DIR] | stop [DIR]" >&2; exit 2 ;;
esac
