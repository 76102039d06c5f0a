#!/usr/bin/env bash
# A real single-node SLURM (slurmctld + slurmd + munge) on this machine, for the HPC tests.
#
#   .ci/slurm.sh start    configure munge and /etc/slurm/slurm.conf, start the three daemons
#                         in the background (PIDs kept in $STATE_DIR), wait until `sinfo` says idle
#   .ci/slurm.sh stop     cancel every job, then stop the daemons started by `start`
#   .ci/slurm.sh status   print the daemons' PIDs, `sinfo` and `squeue`; exit 0 only when the node is usable
#
# It installs nothing: the Debian packages slurmctld, slurmd, slurm-client and munge must
# be there already (.ci/run apt-installs them). It must run as root (it writes /etc/slurm
# and starts the daemons as root, munged as the munge user). The daemons are started in
# the foreground and backgrounded here, so that the PIDs kept are the real ones (PID 1 in
# containers often does not reap daemonised children).
set -euo pipefail

STATE_DIR=${DASKVEC_SLURM_STATE:-/run/daskvec-slurm}
LOG_DIR=/var/log/slurm
CONF=/etc/slurm/slurm.conf
WAIT_S=${DASKVEC_SLURM_WAIT:-30}

log() { echo "slurm.sh: $*" >&2; }
die() { log "$*"; exit 1; }

alive() { # alive NAME -> 0 if the daemon we started under NAME still runs (not a zombie, not a reused PID)
    local f="$STATE_DIR/$1.pid" pid
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null || return 1
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}

node_state() { sinfo -h -o %T 2>/dev/null | head -n1 || true; }

need() {
    [ "$(id -u)" = 0 ] || die "must run as root"
    local missing=()
    for b in munged mungekey munge unmunge slurmctld slurmd sinfo squeue scancel; do
        command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || missing+=("$b")
    done
    [ ${#missing[@]} = 0 ] || die "missing ${missing[*]}; install: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
}

port_busy() { # port_busy PORT -> 0 when something listens on PORT
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
sys.exit(0)
EOF
}

start_munge() {
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    if alive munged; then
        log "munged already running (pid $(cat "$STATE_DIR/munged.pid"))"
    else
        rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
        setsid setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground \
            >"$LOG_DIR/munged.out" 2>&1 </dev/null &
        echo $! >"$STATE_DIR/munged.pid"
    fi
    for _ in $(seq $((WAIT_S * 10))); do
        [ -S /run/munge/munge.socket.2 ] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        alive munged || die "munged exited: $(tail -n 5 "$LOG_DIR/munged.out")"
        sleep 0.1
    done
    die "munged did not answer within ${WAIT_S}s"
}

write_conf() {
    local host cpus mem_mib
    host=$(hostname -s)
    cpus=$(nproc)
    mem_mib=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
    mkdir -p /etc/slurm
    cat >"$CONF" <<EOF
# Written by daskvec's .ci/slurm.sh: a single-node SLURM for tests.
ClusterName=ci
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
# seconds between SIGTERM and SIGKILL when a job is cancelled or hits its walltime
KillWait=10
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem_mib} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
}

cmd_start() {
    need
    mkdir -p "$STATE_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd
    if alive slurmctld && alive slurmd && [ "$(node_state)" = idle ]; then
        log "already running"
        cmd_status
        return 0
    fi
    start_munge
    write_conf
    if ! alive slurmctld; then
        port_busy 6817 && die "port 6817 is taken by another slurmctld; stop it first"
        setsid /usr/sbin/slurmctld -D -c -f "$CONF" >"$LOG_DIR/slurmctld.out" 2>&1 </dev/null &
        echo $! >"$STATE_DIR/slurmctld.pid"
    fi
    if ! alive slurmd; then
        port_busy 6818 && die "port 6818 is taken by another slurmd; stop it first"
        setsid /usr/sbin/slurmd -D -f "$CONF" >"$LOG_DIR/slurmd.out" 2>&1 </dev/null &
        echo $! >"$STATE_DIR/slurmd.pid"
    fi
    local state=""
    for _ in $(seq $((WAIT_S * 10))); do
        state=$(node_state)
        case "$state" in
            idle|mixed|allocated) log "node is $state"; cmd_status; return 0 ;;
        esac
        alive slurmctld || die "slurmctld exited: $(tail -n 5 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmctld.out" 2>/dev/null)"
        alive slurmd || die "slurmd exited: $(tail -n 5 "$LOG_DIR/slurmd.log" "$LOG_DIR/slurmd.out" 2>/dev/null)"
        sleep 0.1
    done
    die "the node is '${state:-unknown}', not idle, after ${WAIT_S}s (see $LOG_DIR)"
}

stop_pid() { # stop_pid NAME: SIGTERM, wait up to 10 s, then SIGKILL
    local f="$STATE_DIR/$1.pid" pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            # a zombie (not reaped by PID 1) counts as gone
            [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; then
            log "$1 ($pid) ignored SIGTERM; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$f"
}

cmd_stop() {
    [ "$(id -u)" = 0 ] || die "must run as root"
    if alive slurmctld; then
        scancel --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 150); do # let slurmd kill the jobs' processes (KillWait=10)
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    stop_pid slurmd
    stop_pid slurmctld
    stop_pid munged
    log "stopped"
}

cmd_status() {
    local ok=0 name
    for name in munged slurmctld slurmd; do
        if alive "$name"; then
            echo "$name: running (pid $(cat "$STATE_DIR/$name.pid"))"
        else
            echo "$name: not running"
            ok=1
        fi
    done
    if command -v sinfo >/dev/null 2>&1; then
        sinfo 2>&1 || ok=1
        squeue 2>&1 || true
    fi
    case "$(node_state)" in idle|mixed|allocated) ;; *) ok=1 ;; esac
    return $ok
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
