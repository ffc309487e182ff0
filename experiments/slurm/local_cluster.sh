#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying `hydra/launcher=slurm` and for the tests
# (tests/test_slurm.py): munged, slurmctld and slurmd as root, state, spool and logs under
# $SLURM_STATE_DIR (default /tmp/attn-slurm).
#
#   sudo experiments/slurm/local_cluster.sh up       # idempotent; prints one line
#   sudo experiments/slurm/local_cluster.sh status   # exit 0 when the node takes jobs
#   sudo experiments/slurm/local_cluster.sh down     # stops what `up` started
#   experiments/slurm/local_cluster.sh check          # could `up` work here? (root, packages)
#
# Needs root and Debian's `slurm-wlm munge` (apt-get install -y slurm-wlm munge). Client commands
# (sbatch, squeue, submitit) read /etc/slurm/slurm.conf, which `up` links to the generated one;
# a real cluster's slurm.conf there is never replaced. Anything missing: one line, exit 1.
set -uo pipefail

STATE=${SLURM_STATE_DIR:-/tmp/attn-slurm}
CONF=$STATE/slurm.conf
ETC=/etc/slurm/slurm.conf
MARK="# attn-slurm one-node test cluster"
NODE=localhost

die() { echo "local_cluster: $*" >&2; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_state() { SLURM_CONF=$CONF timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1; }
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

need() {
    [ "$(id -u)" = 0 ] || die "needs root (slurmd runs jobs as root here); run it with sudo"
    local missing=()
    for c in munged munge unmunge slurmctld slurmd sbatch sinfo scontrol; do
        command -v "$c" >/dev/null || missing+=("$c")
    done
    [ ${#missing[@]} = 0 ] || die "missing ${missing[*]}: apt-get install -y slurm-wlm munge"
}

write_conf() {
    # the node as slurmd sees it (sockets, cores, threads, memory), named $NODE
    local hw
    hw=$(slurmd -C 2>/dev/null | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$NODE/")
    [[ $hw == NodeName=* ]] || die "slurmd -C printed no node line"
    mkdir -p "$STATE"/{ctld,spool,log}
    cat > "$CONF.tmp" <<CONF
$MARK (experiments/slurm/local_cluster.sh)
ClusterName=attn
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# no slurmdbd here: sacct has nothing to read (see the README); jobs that end are logged below
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
$hw
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
    mv "$CONF.tmp" "$CONF"
}

link_etc() {
    if [ -e "$ETC" ] || [ -L "$ETC" ]; then
        grep -q "^$MARK" "$ETC" 2>/dev/null || die "$ETC exists and is not this script's; not touching a real cluster's config"
    fi
    mkdir -p "$(dirname "$ETC")"
    ln -sfn "$CONF" "$ETC"
}

start_munge() {
    munge_ok && return
    [ -s /etc/munge/munge.key ] || {
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null || die "cannot write /etc/munge/munge.key"
    }
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    runuser -u munge -- munged >/dev/null 2>&1 || die "munged did not start (see /var/log/munge/munged.log)"
    touch "$STATE/munged.ours"
    for _ in $(seq 50); do munge_ok && return; sleep 0.1; done
    die "munged started but munge -n | unmunge fails"
}

up() {
    need
    if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" && [[ $(node_state) == idle* || $(node_state) == mix* || $(node_state) == alloc* ]]; then
        echo "local_cluster: up already ($(node_state); conf $CONF)"; return
    fi
    down quiet
    write_conf
    link_etc
    start_munge
    # -c: start with no saved jobs, so an earlier session's state cannot block this one
    slurmctld -c -f "$CONF" || die "slurmctld did not start (see $STATE/log/slurmctld.log)"
    slurmd -f "$CONF" -N "$NODE" || die "slurmd did not start (see $STATE/log/slurmd.log)"
    local s
    for _ in $(seq 100); do
        s=$(node_state)
        [[ $s == idle* ]] && { echo "local_cluster: up (node $NODE idle, partition debug, conf $CONF)"; return; }
        sleep 0.2
    done
    die "node $NODE is '${s:-unreachable}', not idle, after 20 s (see $STATE/log/)"
}

stop_pid() {  # SIGTERM, then SIGKILL after 10 s
    local f=$1 pid
    alive "$f" || { rm -f "$f"; return; }
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return; }; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null; rm -f "$f"
}

down() {
    [ "$(id -u)" = 0 ] || die "needs root; run it with sudo"
    if alive "$STATE/slurmctld.pid"; then
        SLURM_CONF=$CONF timeout 10 scancel --full --quiet --partition=debug 2>/dev/null || true
    fi
    stop_pid "$STATE/slurmd.pid"
    stop_pid "$STATE/slurmctld.pid"
    if [ -f "$STATE/munged.ours" ]; then  # only the munged this script started
        pid=$(cat /run/munge/munged.pid 2>/dev/null)
        [ -n "$pid" ] && kill "$pid" 2>/dev/null
        rm -f "$STATE/munged.ours"
    fi
    if [ -L "$ETC" ] && grep -q "^$MARK" "$ETC" 2>/dev/null; then rm -f "$ETC"; fi
    [ "${1:-}" = quiet ] || echo "local_cluster: down (logs kept in $STATE/log)"
}

status() {
    local s
    if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid"; then
        s=$(node_state)
        echo "local_cluster: slurmctld $(cat "$STATE/slurmctld.pid"), slurmd $(cat "$STATE/slurmd.pid"), node $NODE ${s:-unreachable}"
        [[ $s == idle* || $s == mix* || $s == alloc* ]]
    else
        echo "local_cluster: down"; return 3
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    check) need && echo "local_cluster: can start (root; slurm-wlm and munge installed)" ;;
    *) echo "usage: $0 up|down|status|check" >&2; exit 2 ;;
esac
