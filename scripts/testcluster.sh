#!/usr/bin/env bash
# A real two-node Slurm + ssh test cluster on one machine, built from network namespaces.
#
#   scripts/testcluster.sh up     STATE_DIR   # install packages if missing, start everything, wait until usable
#   scripts/testcluster.sh status STATE_DIR   # sinfo + whether sshd answers on each node
#   scripts/testcluster.sh down   STATE_DIR   # stop everything `up` started, remove namespaces/bridge/hosts block
#
# Layout: the root namespace is the head node (bridge llmtbr0, 10.200.0.1, slurmctld, munged); namespaces
# llmt-n1/llmt-n2 are node1/node2 (10.200.0.11/12, own UTS hostname, one slurmd and one sshd each). No default route
# in the namespaces and ip_forward untouched, so traffic never leaves the bridge. Processes in the namespaces share
# the filesystem (same paths, same Python) with the head node.
#
# After `up`, `source STATE_DIR/env.sh` exports SLURM_CONF and LLMTRAIN_SSH_CONFIG; then `srun -N2 hostname` and
# `ssh -F "$LLMTRAIN_SSH_CONFIG" node1 hostname` work. Needs root and working `ip netns add`; otherwise exits 77
# (tests map 77 to skip).
set -euo pipefail

BRIDGE=llmtbr0
HEAD_IP=10.200.0.1
NODES=(node1 node2)
declare -A NODE_IP=([node1]=10.200.0.11 [node2]=10.200.0.12)
declare -A NODE_NS=([node1]=llmt-n1 [node2]=llmt-n2)
declare -A NODE_VETH=([node1]=llmtv1 [node2]=llmtv2)   # root-side veth ends; the namespace side is eth0
SSH_PORT=2222
HOSTS_BEGIN="# llmtrain-testcluster begin"
HOSTS_END="# llmtrain-testcluster end"
OWNER_FILE=/run/llmtrain-testcluster.owner   # which STATE_DIR currently owns the (global) bridge/namespaces
LOCK_FILE=/run/llmtrain-testcluster.lock
PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge openssh-server openssh-client iproute2 procps)
NEEDED_BINS=(slurmctld slurmd sinfo srun scontrol munged mungekey sshd ssh ssh-keygen ip nsenter unshare ss pgrep)

log() { echo "testcluster: $*" >&2; }
die() { log "$*"; exit 1; }
skip() { echo "testcluster: $*" >&2; exit 77; }

usage() { echo "usage: $0 {up|down|status} STATE_DIR | {node-down|node-up} STATE_DIR NODE" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------------------- helpers
have_bins() {
  local b
  for b in "${NEEDED_BINS[@]}"; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || [ -x "/sbin/$b" ] || return 1
  done
}

ensure_packages() {
  have_bins && return 0
  log "installing packages: ${PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >&2 || die "apt-get install failed"
  have_bins || die "packages installed but binaries still missing"
}

# Expected command name per pid-file stem, so a recycled pid is never killed.
expected_comm() {
  case "$1" in
    slurmctld) echo slurmctld ;;
    slurmd-*) echo slurmd ;;
    sshd-*) echo sshd ;;
    munged) echo munged ;;
    *) echo "" ;;
  esac
}

# pid from STATE/pids or daemon pid file, if that process is alive and is the expected program.
live_pid() {  # live_pid PIDFILE STEM
  local file=$1 stem=$2 pid comm
  [ -s "$file" ] || return 1
  pid=$(tr -dc '0-9' <"$file")
  [ -n "$pid" ] || return 1
  [ -r "/proc/$pid/comm" ] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
  [ "$comm" = "$(expected_comm "$stem")" ] || return 1
  # a zombie (killed, not yet reaped) counts as gone
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
  echo "$pid"
}

pid_files() {  # "STEM FILE" lines for every daemon of a state dir
  local s=$1 n
  echo "munged $s/munge/munged.pid"
  echo "slurmctld $s/slurmctld.pid"
  for n in "${NODES[@]}"; do
    echo "slurmd-$n $s/slurmd-$n.pid"
    echo "sshd-$n $s/sshd-$n.pid"
  done
}

all_alive() {
  local s=$1 stem file
  while read -r stem file; do
    live_pid "$file" "$stem" >/dev/null || return 1
  done < <(pid_files "$s")
}

any_alive() {
  local s=$1 stem file
  while read -r stem file; do
    live_pid "$file" "$stem" >/dev/null && return 0
  done < <(pid_files "$s")
  return 1
}

wait_gone() {  # wait_gone TIMEOUT_TENTHS PID...
  local tenths=$1; shift
  local p i
  for ((i = 0; i < tenths; i++)); do
    local alive=0
    for p in "$@"; do [ -d "/proc/$p" ] && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  return 1
}

ns_exists() { [ -e "/run/netns/$1" ]; }

remove_hosts_block() {
  grep -qF "$HOSTS_BEGIN" /etc/hosts 2>/dev/null || return 0
  local tmp
  tmp=$(mktemp)
  awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1; next} $0==e{skip=0; next} !skip' /etc/hosts >"$tmp"
  cat "$tmp" >/etc/hosts   # rewrite in place: /etc/hosts may be a bind mount
  rm -f "$tmp"
}

add_hosts_block() {
  remove_hosts_block
  {
    echo "$HOSTS_BEGIN"
    local n
    for n in "${NODES[@]}"; do echo "${NODE_IP[$n]} $n"; done
    echo "$HOSTS_IP_LINE"
    echo "$HOSTS_END"
  } >>/etc/hosts
}

port_taken() { [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]; }

# ------------------------------------------------------------------------------------------------------------- down
# Stop daemons recorded in STATE (by pid file, checking the program name), kill whatever still runs inside our
# namespaces (job steps, ssh sessions: all started by this cluster), then remove network objects and hosts block.
teardown() {
  local s=$1 stem file pid
  local pids=()
  if [ -d "$s" ]; then
    while read -r stem file; do
      if pid=$(live_pid "$file" "$stem"); then
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
      fi
    done < <(pid_files "$s")
  fi
  # Slurm clients in the root namespace still attached to this cluster (srun waits forever once slurmd is gone).
  if [ -d "$s" ]; then
    for pid in $(pgrep -x srun; pgrep -x salloc; pgrep -x sattach); do
      if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -xF "SLURM_CONF=$s/slurm.conf" >/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done
  fi
  # The namespaces, bridge and hosts block are global: leave them alone if another live cluster owns them.
  local owner net=1
  owner=$(cat "$OWNER_FILE" 2>/dev/null || true)
  if [ -n "$owner" ] && [ "$owner" != "$s" ] && any_alive "$owner"; then net=0; fi
  local n ns
  for n in "${NODES[@]}"; do
    ns=${NODE_NS[$n]}
    if [ $net = 1 ] && ns_exists "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
      done
    fi
  done
  if [ ${#pids[@]} -gt 0 ] && ! wait_gone 20 "${pids[@]}"; then   # slurmstepd ignores TERM: KILL after 2 s
    for pid in "${pids[@]}"; do [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null || true; done
    wait_gone 30 "${pids[@]}" || log "some processes did not exit: ${pids[*]}"
  fi
  if [ $net = 0 ]; then
    log "network objects belong to the live testcluster at $owner; left in place"
  else
    for n in "${NODES[@]}"; do
      ns=${NODE_NS[$n]}
      if ns_exists "$ns"; then
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
      fi
      ip link del "${NODE_VETH[$n]}" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    remove_hosts_block
  fi
  if [ -d "$s" ]; then
    rm -f "$s/cluster.state" "$s/slurmctld.pid" "$s"/slurmd-*.pid "$s"/sshd-*.pid "$s/munge/munged.pid"
  fi
  if [ -f "$OWNER_FILE" ] && [ "$(cat "$OWNER_FILE" 2>/dev/null)" = "$s" ]; then rm -f "$OWNER_FILE"; fi
}

cmd_down() {
  local s=$1
  [ "$(id -u)" = 0 ] || skip "not root: nothing to tear down"
  [ -d "$s" ] && s=$(cd "$s" && pwd -P)
  exec 9>"$LOCK_FILE"
  flock -w 120 9 || die "could not take $LOCK_FILE"
  teardown "$s"
  # A previous owner that crashed leaves the global objects: remove them too when no daemon of its is alive.
  if [ -f "$OWNER_FILE" ]; then
    local other
    other=$(cat "$OWNER_FILE")
    if ! any_alive "$other"; then teardown "$other"; rm -f "$OWNER_FILE"; fi
  fi
  echo "testcluster down ($s)"
}

# ----------------------------------------------------------------------------------------------------------- status
cmd_status() {  # exit 0 when the cluster is up and both nodes answer on ssh, 1 otherwise
  local s=$1 n out pid ok=0
  if [ -f "$s/cluster.state" ]; then
    echo "testcluster up ($s): $(cat "$s/cluster.state")"
    SLURM_CONF="$s/slurm.conf" sinfo -N -o '%N %T %c %P' 2>&1 || ok=1
  else
    echo "testcluster: not up ($s)"
    ok=1
  fi
  for n in "${NODES[@]}"; do
    if [ -f "$s/ssh_config" ] && out=$(ssh -F "$s/ssh_config" "$n" hostname 2>&1); then
      echo "ssh $n: ok (hostname $out)"
    else
      echo "ssh $n: no answer"
      ok=1
    fi
  done
  local stem file
  while read -r stem file; do
    if pid=$(live_pid "$file" "$stem"); then echo "$stem: pid $pid"; else echo "$stem: not running"; fi
  done < <(pid_files "$s")
  return $ok
}

# --------------------------------------------------------------------------------------------------------------- up
write_slurm_conf() {
  local s=$1 ctld_port=$2 slurmd_port=$3 cpus=$4
  local head
  head=$(hostname -s)
  cat >"$s/slurm.conf" <<EOF
# generated by scripts/testcluster.sh
ClusterName=llmtci
SlurmctldHost=${head}(${HEAD_IP})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job is held for the credential lifetime (cred_expire, 120 s by default); 15 s keeps the requeue tests
# short. The scheduler intervals (60 s and 30 s by default) let a job whose hold ended start within seconds.
AuthInfo=socket=$s/munge/munge.socket,cred_expire=15
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool-%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd-%n.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=node1 NodeAddr=${NODE_IP[node1]} NodeHostname=node1 CPUs=$cpus State=UNKNOWN
NodeName=node2 NodeAddr=${NODE_IP[node2]} NodeHostname=node2 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

write_ssh_files() {
  local s=$1 n
  mkdir -p "$s/ssh"
  chmod 700 "$s/ssh"
  [ -f "$s/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C llmt-testcluster-host -f "$s/ssh/host_ed25519"
  [ -f "$s/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C llmt-testcluster-client -f "$s/ssh/id_ed25519"
  cp "$s/ssh/id_ed25519.pub" "$s/ssh/authorized_keys"
  chmod 600 "$s/ssh/authorized_keys"
  for n in "${NODES[@]}"; do
    cat >"$s/ssh/sshd_config-$n" <<EOF
# generated by scripts/testcluster.sh
Port $SSH_PORT
ListenAddress ${NODE_IP[$n]}
HostKey $s/ssh/host_ed25519
PidFile $s/sshd-$n.pid
AuthorizedKeysFile $s/ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
X11Forwarding no
AcceptEnv LANG LC_*
SetEnv PATH=$PATH
Subsystem sftp internal-sftp
EOF
  done
  cat >"$s/ssh_config" <<EOF
# generated by scripts/testcluster.sh: ssh -F $s/ssh_config node1 ...
Host *
  Port $SSH_PORT
  User root
  IdentityFile $s/ssh/id_ed25519
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  ConnectTimeout 5
  LogLevel ERROR
EOF
}

start_munged() {
  local s=$1 i
  mkdir -p "$s/munge"
  chmod a+x "$s"   # munged runs as user munge and must traverse the state dir (mkdtemp makes it 0700)
  chown munge:munge "$s/munge"
  chmod 700 "$s/munge"
  if [ ! -s "$s/munge/munge.key" ]; then
    mungekey -c -k "$s/munge/munge.key"
    chown munge:munge "$s/munge/munge.key"
    chmod 400 "$s/munge/munge.key"
  fi
  rm -f "$s/munge/munge.socket" "$s/munge/munge.socket.lock"
  # --force: the state dir usually sits under world-writable /tmp, which munged otherwise calls insecure.
  runuser -u munge -- /usr/sbin/munged --force \
    --socket="$s/munge/munge.socket" --key-file="$s/munge/munge.key" --pid-file="$s/munge/munged.pid" \
    --log-file="$s/munge/munged.log" --seed-file="$s/munge/munged.seed" >>"$s/munge/munged.out" 2>&1 9>&- \
    || { cat "$s/munge/munged.out" >&2; return 1; }
  for ((i = 0; i < 50; i++)); do [ -S "$s/munge/munge.socket" ] && return 0; sleep 0.1; done
  return 1
}

setup_network() {
  local n ns veth
  ip link add "$BRIDGE" type bridge
  ip addr add "$HEAD_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for n in "${NODES[@]}"; do
    ns=${NODE_NS[$n]}
    veth=${NODE_VETH[$n]}
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "${veth}p"
    ip link set "${veth}p" netns "$ns"
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "${veth}p" name eth0
    ip -n "$ns" addr add "${NODE_IP[$n]}/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

in_node() {  # in_node NODE COMMAND-STRING: run COMMAND-STRING under sh in NODE's netns with hostname NODE
  local n=$1; shift
  nsenter --net="/run/netns/${NODE_NS[$n]}" unshare --uts sh -c "hostname $n; $*" 9>&-
}

wait_until() {  # wait_until TIMEOUT_S DESCRIPTION COMMAND...
  local timeout=$1 what=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then log "timed out after ${timeout}s waiting for $what"; return 1; fi
    sleep 0.2
  done
}

sinfo_all_idle() {
  local states
  states=$(sinfo -h -o %T 2>/dev/null) || return 1
  [ -n "$states" ] && [ -z "$(echo "$states" | grep -vx idle)" ]
}

on_up_error() {
  local rc=$? s=$1
  trap - ERR EXIT
  [ $rc = 0 ] && return 0
  log "up failed (exit $rc); log tails follow, then teardown"
  local f
  for f in "$s/slurmctld.log" "$s"/slurmd-*.log "$s"/sshd-*.log "$s/munge/munged.log"; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }
  done
  teardown "$s" || true
  exit "$rc"
}

cmd_up() {
  local s=$1
  local t0=$SECONDS
  [ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (uid $(id -u))"
  command -v ip >/dev/null 2>&1 || ensure_packages   # the netns probe itself needs iproute2
  local probe="llmt-probe-$$"
  if ! ip netns add "$probe" 2>/dev/null; then skip "'ip netns add' fails here: no network namespaces"; fi
  ip netns del "$probe" 2>/dev/null || true

  mkdir -p "$s"
  s=$(cd "$s" && pwd -P)
  # Daemons are started with 9>&- so they never inherit (and hold) this lock.
  exec 9>"$LOCK_FILE"
  flock -w 120 9 || die "could not take $LOCK_FILE (another testcluster up/down is stuck?)"

  if [ -f "$OWNER_FILE" ]; then
    local other
    other=$(cat "$OWNER_FILE")
    if [ "$other" = "$s" ] && [ -f "$s/cluster.state" ] && all_alive "$s"; then
      echo "testcluster already up ($s): $(cat "$s/cluster.state")"
      return 0
    fi
    if [ "$other" != "$s" ] && any_alive "$other"; then
      die "another testcluster is up with state dir $other; run: $0 down $other"
    fi
    log "cleaning up a stale testcluster ($other)"
    teardown "$other"
  fi
  teardown "$s"   # leftovers of a crashed run without owner file (namespaces, bridge, hosts block)

  ensure_packages
  echo "$s" >"$OWNER_FILE"
  trap 'on_up_error "$s"' EXIT

  rm -rf "$s/state" "$s"/spool-* "$s"/*.log "$s/cluster.state"
  mkdir -p "$s/state"

  local ctld_port=6817 slurmd_port=6818
  while port_taken "$ctld_port"; do ctld_port=$((ctld_port + 2)); done
  [ "$ctld_port" = 6817 ] || slurmd_port=$((ctld_port + 1))
  local cpus
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS, which tests set to 1
  [ "$cpus" -gt 2 ] && cpus=2

  write_slurm_conf "$s" "$ctld_port" "$slurmd_port" "$cpus"
  write_ssh_files "$s"
  HOSTS_IP_LINE="$HEAD_IP headnode"
  export SLURM_CONF="$s/slurm.conf"

  setup_network
  add_hosts_block
  start_munged "$s" || die "munged did not start (see $s/munge/munged.log)"
  slurmctld -f "$SLURM_CONF" 9>&- || die "slurmctld failed to start (see $s/slurmctld.log)"
  mkdir -p /run/sshd
  chmod 755 /run/sshd
  local n
  for n in "${NODES[@]}"; do
    in_node "$n" "exec slurmd -f '$SLURM_CONF'" || die "slurmd on $n failed to start (see $s/slurmd-$n.log)"
    in_node "$n" "exec /usr/sbin/sshd -f '$s/ssh/sshd_config-$n' -E '$s/sshd-$n.log'" \
      || die "sshd on $n failed to start (see $s/sshd-$n.log)"
  done

  wait_until 30 "sinfo to show all nodes idle" sinfo_all_idle
  for n in "${NODES[@]}"; do
    wait_until 15 "ssh to $n" ssh -F "$s/ssh_config" "$n" true
  done
  wait_until 10 "daemon pid files" all_alive "$s"

  cat >"$s/env.sh" <<EOF
# generated by scripts/testcluster.sh; source me
export SLURM_CONF=$s/slurm.conf
export LLMTRAIN_SSH_CONFIG=$s/ssh_config
EOF
  local summary="nodes node1=${NODE_IP[node1]} node2=${NODE_IP[node2]} head=headnode($HEAD_IP); slurmctld :$ctld_port slurmd :$slurmd_port; ssh :$SSH_PORT; env $s/env.sh"
  echo "$summary" >"$s/cluster.state"
  trap - EXIT
  echo "testcluster up in $((SECONDS - t0))s: $summary"
}

cmd_node_down() {  # a node dies: every process in its namespace killed at once (slurmd, sshd, jobs), then Slurm
  # is told it is down, as an admin or the health check would (waiting for SlurmdTimeout would take minutes)
  local s=$1 n=$2
  [ -n "${NODE_NS[$n]:-}" ] || die "no node $n (nodes: ${NODES[*]})"
  export SLURM_CONF="$s/slurm.conf"
  local pids
  pids=$(ip netns pids "${NODE_NS[$n]}" || true)
  [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  scontrol update NodeName="$n" State=DOWN Reason="node-down by testcluster" || die "scontrol could not set $n down"
  echo "testcluster: $n is down"
}

node_idle() { [ "$(sinfo -h -n "$1" -o %T 2>/dev/null)" = idle ]; }

cmd_node_up() {  # the node comes back: its slurmd and sshd started again, Slurm told to use it
  local s=$1 n=$2
  [ -n "${NODE_NS[$n]:-}" ] || die "no node $n (nodes: ${NODES[*]})"
  export SLURM_CONF="$s/slurm.conf"
  in_node "$n" "exec slurmd -f '$SLURM_CONF'" || die "slurmd on $n failed to start (see $s/slurmd-$n.log)"
  in_node "$n" "exec /usr/sbin/sshd -f '$s/ssh/sshd_config-$n' -E '$s/sshd-$n.log'" \
    || die "sshd on $n failed to start (see $s/sshd-$n.log)"
  scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
  wait_until 30 "$n to be idle" node_idle "$n" || die "$n did not come back idle"
  wait_until 15 "ssh to $n" ssh -F "$s/ssh_config" "$n" true || die "ssh to $n does not answer"
  echo "testcluster: $n is up"
}

# ------------------------------------------------------------------------------------------------------------- main
case "$1" in
  up|down|status) [ $# -eq 2 ] || usage ;;
  node-down|node-up) [ $# -eq 3 ] || usage ;;
  *) usage ;;
esac
case "$1" in
  up) cmd_up "$2" ;;
  down) cmd_down "$2" ;;
  status) cmd_status "$2" ;;
  node-down) cmd_node_down "$2" "$3" ;;
  node-up) cmd_node_up "$2" "$3" ;;
esac
