# shellcheck shell=bash
# A private one-node Slurm cluster for tests, as root and without systemd (source this file):
#
#   cluster_skip_reason    prints why no cluster can start here (not root, Slurm or munge missing)
#                          and succeeds; fails, printing nothing, when one can
#   cluster_start DIR      starts munged, slurmctld and slurmd, all of it under DIR (a new folder),
#                          exports SLURM_CONF=DIR/slurm.conf and returns once the node is idle
#   cluster_stop           cancels every job, stops the three daemons by their pids and fails,
#                          naming them, when any process of the cluster is left after that
#
# Nothing under /etc or /run is read or written, and nothing listens on Slurm's usual ports: munged
# has its own key, socket and pid file (slurm.conf's AuthInfo=socket=...), slurmctld and slurmd
# ports of their own, and state, spool and logs are in DIR. What it leaves out against a production
# cluster (cgroups, accounting, a real GPU) is listed in docs/ci.md.

cluster_skip_reason() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "not root: slurmd runs jobs as their users and munged as the munge user"
    return 0
  fi
  local tool
  for tool in munged slurmctld slurmd sbatch scontrol squeue scancel srun setpriv; do
    if ! command -v "$tool" >/dev/null; then
      echo "no $tool: Debian's slurmctld, slurmd, slurm-client and munge are not installed (scripts/setup.sh --test-tools)"
      return 0
    fi
  done
  if ! getent passwd munge >/dev/null; then
    echo "no munge user (Debian's munge package makes it)"
    return 0
  fi
  return 1
}

# Two TCP ports free on this machine now (the kernel's choice), for slurmctld and slurmd.
_cluster_free_ports() {
  python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))'
}

# Waits up to $1 seconds for the command after it to succeed.
_cluster_wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

_cluster_node_idle() {
  scontrol show node localhost 2>/dev/null | grep -Eq 'State=IDLE( |$)'
}

_cluster_no_jobs() {
  [[ -z $(squeue -h -o %i 2>/dev/null) ]]
}

_cluster_logs() {
  local f
  for f in "$CLUSTER_DIR"/log/*; do
    echo "--- $f (end)" >&2
    tail -n 15 "$f" >&2
  done
}

cluster_start() {
  CLUSTER_DIR=$1
  CLUSTER_PIDS=()
  unset SLURM_CONF
  local d=$CLUSTER_DIR up
  mkdir -p "$d/state" "$d/spool" "$d/log"
  d=$(cd "$d" && pwd)
  CLUSTER_DIR=$d
  up=$d
  while [[ $up != / ]]; do
    up=$(dirname "$up")
    [[ $(stat -c %A "$up") == *[xt] ]] ||
      { echo "cluster: $up is closed to other users: munged, as the munge user, cannot reach $d" >&2; return 1; }
  done
  # munged runs as the munge user and checks its folders: the key's is its own and closed, the
  # socket's open to all (clients connect there), and every folder above them traversable.
  chmod 755 "$d"
  mkdir -m 700 "$d/munge"
  mkdir -m 755 "$d/munge-run"
  head -c 1024 /dev/urandom >"$d/munge/munge.key"
  chmod 400 "$d/munge/munge.key"
  touch "$d/log/munged.log"
  chown -R munge:munge "$d/munge" "$d/munge-run" "$d/log/munged.log"
  setpriv --reuid=munge --regid=munge --init-groups \
    munged --foreground --socket="$d/munge-run/munge.socket" --key-file="$d/munge/munge.key" \
    --pid-file="$d/munge-run/munged.pid" --log-file="$d/log/munged.log" --seed-file="$d/munge/munged.seed" \
    2>"$d/log/munged.stderr" &
  CLUSTER_PIDS+=($!)
  _cluster_wait_for 10 test -S "$d/munge-run/munge.socket" || { echo "cluster: munged did not start" >&2; _cluster_logs; return 1; }

  local ctld_port slurmd_port node
  read -r ctld_port slurmd_port < <(_cluster_free_ports)
  # The node as slurmd finds it (CPUs, sockets, cores, threads, memory), named localhost.
  node=$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]*/NodeName=localhost NodeAddr=127.0.0.1/')
  cat >"$d/slurm.conf" <<EOF
ClusterName=lattntest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge-run/munge.socket
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
# No cgroups: processes are tracked by their parent pids, tasks are not bound to CPUs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# No accounting database: sacct has nothing; --account is kept on the job as given, not checked.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A stand-in GPU (File=/dev/null, gres.conf) so that --gpus-per-task is scheduled as on a GPU node.
GresTypes=gpu
ReturnToService=2
KillWait=10
$node Features=lattn_test Gres=gpu:1 State=UNKNOWN
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=spare Nodes=localhost MaxTime=01:00:00 State=UP
EOF
  echo "Name=gpu File=/dev/null Count=1" >"$d/gres.conf"
  # slurmd loads a cgroup plugin whatever ProctrackType and TaskPlugin say. cgroup/v1's loading
  # touches no cgroup while no plugin uses one; cgroup/v2's, on a cgroup v2 host, asks systemd over
  # D-Bus for a scope and stops slurmd in a container that has neither.
  echo "CgroupPlugin=cgroup/v1" >"$d/cgroup.conf"
  export SLURM_CONF=$d/slurm.conf
  slurmctld -D -f "$SLURM_CONF" >"$d/log/slurmctld.stderr" 2>&1 &
  CLUSTER_PIDS+=($!)
  slurmd -D -N localhost -f "$SLURM_CONF" >"$d/log/slurmd.stderr" 2>&1 &
  CLUSTER_PIDS+=($!)
  _cluster_wait_for 30 _cluster_node_idle || { echo "cluster: the node is not idle after 30 s" >&2; _cluster_logs; return 1; }
}

# The pids of processes that carry this cluster's SLURM_CONF (every daemon, step and job process
# does), other than this shell and what it is running now.
_cluster_processes() {
  python3 - "$SLURM_CONF" "$$" <<'EOF'
import os, sys
conf, shell = ("SLURM_CONF=" + sys.argv[1]).encode(), int(sys.argv[2])
parents = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            pass
def below_shell(pid):
    while pid > 1:
        if pid == shell:
            return True
        pid = parents.get(pid, 0)
    return False
for pid in sorted(parents):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if conf in f.read().split(b"\0") and not below_shell(pid):
                print(pid)
    except OSError:
        pass
EOF
}

cluster_stop() {
  [[ -n ${CLUSTER_DIR:-} ]] || return 0
  local status=0 pid
  # Jobs first, while slurmd can still end their steps.
  if [[ -n ${SLURM_CONF:-} ]] && scontrol ping >/dev/null 2>&1; then
    scancel --user=root 2>/dev/null || true
    _cluster_wait_for 30 _cluster_no_jobs ||
      { echo "cluster: jobs still there after 30 s: $(squeue -h -o '%i %T' | tr '\n' ' ')" >&2; status=1; }
  fi
  for pid in "${CLUSTER_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${CLUSTER_PIDS[@]}"; do
    # Each was started by this shell: wait reaps it. One that ignores TERM for 15 s is killed.
    if ! _cluster_wait_for 15 bash -c "! kill -0 $pid 2>/dev/null || grep -qs '^State:.*Z' /proc/$pid/status"; then
      echo "cluster: pid $pid did not stop on SIGTERM; killed" >&2
      kill -KILL "$pid" 2>/dev/null || true
      status=1
    fi
    wait "$pid" 2>/dev/null || true
  done
  local left=""
  [[ -z ${SLURM_CONF:-} ]] || left=$(_cluster_processes)
  if [[ -n $left ]]; then
    echo "cluster: left behind, now killed:" >&2
    for pid in $left; do
      echo "  $pid $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" >&2
      kill -KILL "$pid" 2>/dev/null || true
    done
    status=1
  fi
  CLUSTER_PIDS=()
  unset CLUSTER_DIR
  return "$status"
}
