#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, so the SLURM profile can be tested against real sbatch and squeue:
#
#   bash scripts/slurm-local.sh start    # install slurm-wlm and munge if missing, write the configs, start the daemons
#   bash scripts/slurm-local.sh status   # what sinfo says
#   bash scripts/slurm-local.sh stop     # stop slurmd, slurmctld and munged
#
# Debian or Ubuntu, as root. `start` is idempotent: daemons already running are left alone unless the configs
# changed. The cluster has one node (this machine: `hostname -s`, its CPUs and most of its memory) in one default
# partition, `local`, which workflow/profiles/slurm-local names. There is no accounting database, so `sacct` does not
# answer: jobs are polled with squeue, which keeps finished jobs for MinJobAge seconds.
set -euo pipefail

PARTITION=local
CONF_DIR=/etc/slurm
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd
LOG_DIR=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_KEY=/etc/munge/munge.key
MUNGE_RUN=/run/munge
MUNGE_PID=$MUNGE_RUN/munged.pid
# Seconds to wait for the node to come up idle.
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}

say() { echo "slurm-local: $*"; }
die() { echo "slurm-local: error: $*" >&2; exit 1; }

require_root() {
    [ "$(id -u)" -eq 0 ] || die "run as root: it installs packages, writes $CONF_DIR and starts system daemons."
}

require_apt() {
    command -v apt-get >/dev/null 2>&1 ||
        die "this needs an apt-based system (Debian or Ubuntu) to install slurm-wlm and munge."
}

# The pid in a pid file, if that process is alive.
alive_pid() {
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

install_packages() {
    local tool missing=()
    for tool in slurmctld slurmd sbatch squeue sinfo munged; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        say "slurm-wlm and munge are installed"
        return
    fi
    say "installing slurm-wlm and munge (missing: ${missing[*]})"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge
}

start_munge() {
    if [ ! -s "$MUNGE_KEY" ]; then
        say "creating the munge key $MUNGE_KEY"
        mkdir -p "$(dirname "$MUNGE_KEY")"
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge
    chmod 0700 /etc/munge
    chmod 0400 "$MUNGE_KEY"
    mkdir -p "$MUNGE_RUN" /var/lib/munge /var/log/munge
    chown munge:munge "$MUNGE_RUN" /var/lib/munge /var/log/munge
    chmod 0755 "$MUNGE_RUN"
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        say "munged is running"
        return
    fi
    say "starting munged as user munge"
    # --force: start even over a stale socket left by a munged that was killed.
    runuser -u munge -- munged --force
    for _ in $(seq 20); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.5
    done
    die "munged does not answer (munge -n | unmunge fails); see /var/log/munge/munged.log."
}

# RealMemory in MB: a bit under what `free -m` reports, since slurmd refuses a node configured with more than it finds.
real_memory() {
    local total
    total=$(free -m | awk '/^Mem:/ {print $2}')
    echo $((total * 95 / 100))
}

slurm_conf() {
    local host=$1 cpus=$2 memory=$3
    cat <<EOF
# Written by scripts/slurm-local.sh: a single-node test cluster, no accounting.
ClusterName=cgrpo-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# squeue is the only status source without accounting: keep finished jobs visible for 10 minutes.
MinJobAge=600
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

cgroup_conf() {
    cat <<EOF
# Written by scripts/slurm-local.sh. proctrack/linuxproc and task/none use no cgroups.
CgroupPlugin=cgroup/v1
CgroupAutomount=no
EOF
}

# Write $2 to the file $1 if it differs; return 0 when the file changed.
write_if_changed() {
    if [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; then
        return 1
    fi
    say "writing $1"
    printf '%s\n' "$2" >"$1"
}

node_state() {
    sinfo --noheader --Node --nodes "$1" --format %t 2>/dev/null | head -n 1 || true
}

start() {
    require_root
    require_apt
    export PATH=$PATH:/usr/sbin:/sbin
    install_packages
    start_munge

    local host cpus memory changed=0
    host=$(hostname -s)
    cpus=$(nproc)
    memory=$(real_memory)
    say "node $host: $cpus CPUs, RealMemory=$memory MB, partition $PARTITION"
    mkdir -p "$CONF_DIR" "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR"
    write_if_changed "$CONF_DIR/slurm.conf" "$(slurm_conf "$host" "$cpus" "$memory")" && changed=1
    write_if_changed "$CONF_DIR/cgroup.conf" "$(cgroup_conf)" && changed=1
    if [ "$changed" -eq 1 ] && { alive_pid "$CTLD_PID" >/dev/null || alive_pid "$SLURMD_PID" >/dev/null; }; then
        say "the configs changed: restarting the SLURM daemons"
        stop_daemon slurmd "$SLURMD_PID"
        stop_daemon slurmctld "$CTLD_PID"
    fi

    if alive_pid "$CTLD_PID" >/dev/null; then
        say "slurmctld is running (pid $(cat "$CTLD_PID"))"
    else
        # -c, not -i alone: jobs saved by a controller that was killed (a machine snapshotted mid-run, a test
        # killed with its jobs queued) would be recovered and hold the node's CPUs until their time limit.
        say "starting slurmctld -c (clearing jobs left from an earlier controller)"
        slurmctld -c
    fi
    if alive_pid "$SLURMD_PID" >/dev/null; then
        say "slurmd is running (pid $(cat "$SLURMD_PID"))"
    else
        say "starting slurmd"
        slurmd
    fi

    say "waiting up to ${TIMEOUT}s for node $host to be idle"
    local state="" resumed=0
    for _ in $(seq "$((TIMEOUT * 2))"); do
        state=$(node_state "$host")
        case "$state" in
            idle | mix | mixed | alloc | allocated)
                say "node $host is $state; partitions:"
                sinfo
                report_queue
                return
                ;;
            down* | drain* | drng*)
                # A node that went away with jobs on it (or was restarted) comes back down or drained.
                if [ "$resumed" -eq 0 ]; then
                    say "node $host is $state: resuming it"
                    scontrol update NodeName="$host" State=RESUME || true
                    resumed=1
                fi
                ;;
        esac
        sleep 0.5
    done
    tail -n 5 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2 || true
    die "node $host did not become idle within ${TIMEOUT}s (sinfo state: '${state:-no answer}');" \
        "see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmd.log."
}

# Jobs queued on a cluster that was already running when `start` was called take CPUs from the next workflow.
report_queue() {
    local jobs
    jobs=$(squeue -h | wc -l)
    [ "$jobs" -eq 0 ] && return
    say "warning: $jobs job(s) already in the queue (squeue lists them); cancel them with 'scancel --user=$(id -un)'" \
        "or run '$0 stop' then '$0 start' to begin with an empty queue."
}

stop_daemon() {
    local name=$1 pidfile=$2 pid
    if ! pid=$(alive_pid "$pidfile"); then
        say "$name is not running"
        rm -f "$pidfile"
        return
    fi
    say "stopping $name (pid $pid)"
    kill "$pid"
    for _ in $(seq 40); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return; }
        sleep 0.25
    done
    say "$name (pid $pid) did not stop within 10s: killing it"
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

stop() {
    require_root
    stop_daemon slurmd "$SLURMD_PID"
    stop_daemon slurmctld "$CTLD_PID"
    stop_daemon munged "$MUNGE_PID"
}

status() {
    command -v sinfo >/dev/null 2>&1 || die "sinfo is not installed: run '$0 start' first."
    sinfo
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
