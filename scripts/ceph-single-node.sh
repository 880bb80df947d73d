#!/usr/bin/env bash
# ceph-single-node.sh: a throw-away one-node Ceph cluster for tests.
#
# Usage:
#   scripts/ceph-single-node.sh start     DIR   fresh cluster in DIR; prints
#                                               "ceph-single-node: ready: DIR/ceph.conf"
#   scripts/ceph-single-node.sh stop      DIR   stops every daemon of DIR, keeps the data
#   scripts/ceph-single-node.sh stop-osd  DIR   stops the OSD only (I/O to the pool then blocks)
#   scripts/ceph-single-node.sh start-osd DIR   restarts the OSD on the same data and waits
#                                               until its PGs are active+clean again
#
# What `start` builds, from Debian's Ceph 16.2 (Pacific) packages only (ceph-mon, ceph-osd,
# ceph-mgr, ceph-common): no cephadm, no containers, no systemd. One monitor (mon.a), one
# manager (mgr.x) and one OSD (osd.0) run as plain processes, daemonized by Ceph itself in
# their own session (setsid), so they outlive the calling shell and hold none of its pipes.
# The OSD's BlueStore lives in the sparse file DIR/osd0/block (size $CEPH_OSD_BYTES, 10 GiB
# by default; RocksDB and its WAL inside the same file). Cephx is on; the client.admin key is
# in DIR/ceph.client.admin.keyring, which DIR/ceph.conf names, so `ceph -c DIR/ceph.conf`,
# `rbd -c DIR/ceph.conf` and librbd programs (CEPH_CONF=DIR/ceph.conf, e.g. fio's rbd
# engine) need nothing else. A replicated pool `rbd` (size 1, min_size 1, $CEPH_PG_NUM PGs,
# autoscaler off) is created and `rbd pool init`ed.
#
# Invariants:
# - Everything lives under DIR: data, logs (DIR/log), pid files and admin sockets (DIR/run),
#   crash dumps (DIR/crash). Nothing is written to /etc/ceph, /var/lib/ceph, /var/run/ceph
#   or /var/log/ceph. Clients get no admin socket and no log file (Ceph's client defaults).
# - Network: loopback only. The monitor listens on 127.0.0.1 with both protocols,
#   msgr2 on $CEPH_MON_PORT (default 40789) and msgr1 on $CEPH_MON_V1_PORT (default
#   CEPH_MON_PORT+1): every librados/librbd of the last years speaks v2 and prefers it,
#   v1 keeps older clients working. The mgr and the OSD bind free ports in 6800-7300
#   on 127.0.0.1. Two clusters can run at once if they have different monitor ports.
# - `start` always makes a fresh cluster: if DIR holds the data of a stopped cluster of this
#   script (marker file DIR/.ceph-single-node) it is wiped. A DIR that is neither empty nor
#   marked is refused, so a typo cannot wipe a real directory. If a daemon of DIR is still
#   running, `start` fails (exit 1) and says to run `stop` first: it never silently reuses a
#   cluster whose state a previous test may have changed.
# - A daemon is identified by its pid file and, to be safe against pid reuse and lost pid
#   files, by its command line naming DIR/ceph.conf; only such processes are ever signalled.
# - `start` prints the ready line only once osd.0 is up, every PG is active+clean and a
#   test image could be created and removed (it also wants HEALTH_OK but only notes on
#   stderr when the health is otherwise). If `start` or `start-osd` cannot finish within
#   $CEPH_START_TIMEOUT seconds (default 180), it prints the tails of the daemon logs,
#   stops what it started (the data stays for a look) and exits 1.
# - `stop` stops the OSD, the mgr, then the monitor (SIGTERM, then SIGKILL after
#   $CEPH_STOP_TIMEOUT seconds, default 30), keeps the data, and exits 0 also when nothing
#   runs. `stop-osd` sends $CEPH_OSD_STOP_SIGNAL (TERM by default; KILL to simulate a
#   crash) and returns once the monitor has the OSD down; clients' I/O then waits.
# - Size: BlueStore's cache is a fixed 256 MiB and the OSD's memory target 1 GiB; the mgr
#   (about 300 MB resident) runs only its always-on modules, device health scraping off.
#   The sparse file grows with the data written: DIR's file system needs that much room
#   (BlueStore stops the OSD on ENOSPC).
# - Clients: librbd reads the key from the `keyring` line of [client] in DIR/ceph.conf;
#   Ceph's default keyring paths (/etc/ceph/...) are not used. A killed client's watch,
#   hence its exclusive lock, expires after 5 s (osd_client_watch_timeout, see the conf).
#   The librbd cache keeps Ceph's default (on, writethrough until the first flush).
#
# Duration (2-core VM): `start` about 13 s (monitor and OSD creation, BlueStore mkfs, first
# peering, a test `rbd create`/`rbd rm`), `stop` under 1 s, `stop-osd` about 1 s,
# `start-osd` about 5-10 s (BlueStore mount, peering, fresh PG stats).
#
# Needs root or at least write access to DIR; run as root in CI.
set -euo pipefail

PROG=ceph-single-node
CEPH_OSD_BYTES=${CEPH_OSD_BYTES:-$((10 * 1024 * 1024 * 1024))}
CEPH_MON_PORT=${CEPH_MON_PORT:-40789}
CEPH_MON_V1_PORT=${CEPH_MON_V1_PORT:-$((CEPH_MON_PORT + 1))}
CEPH_PG_NUM=${CEPH_PG_NUM:-8}
CEPH_START_TIMEOUT=${CEPH_START_TIMEOUT:-180}
CEPH_STOP_TIMEOUT=${CEPH_STOP_TIMEOUT:-30}
# The OSD's stop signal for `stop-osd`: TERM is a clean shutdown (the OSD tells the monitor
# it goes down); KILL is a crash (the script then marks it down itself).
CEPH_OSD_STOP_SIGNAL=${CEPH_OSD_STOP_SIGNAL:-TERM}
# The distribution's interpreter: ceph-common depends on it, and a pyenv shim would be slow.
PY=/usr/bin/python3

# Daemons, in the order `stop` stops them (the OSD first, while the monitor can still hear
# its goodbye).
DAEMONS=(osd.0 mgr.x mon.a)

log() { echo "$PROG: $*" >&2; }
die() { echo "$PROG: error: $*" >&2; exit 1; }

usage() {
  echo "usage: $0 start|stop|stop-osd|start-osd DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
CMD=$1
[ -n "$2" ] || usage
case "$2" in
  *[[:space:]\$\;\#\"\'\\]*) die "DIR must not contain white space or any of \$;#\"'\\: $2" ;;
esac
DIR=$(realpath -m -- "$2")
CONF=$DIR/ceph.conf
MARKER=$DIR/.ceph-single-node
DEADLINE=$((SECONDS + CEPH_START_TIMEOUT))

for tool in ceph ceph-mon ceph-mgr ceph-osd ceph-authtool monmaptool rbd "$PY" timeout setsid ss; do
  command -v "$tool" >/dev/null ||
    die "$tool not found: install Debian's ceph-mon ceph-osd ceph-mgr ceph-common"
done

# ---------------------------------------------------------------------------------------
# Processes

# The pid of daemon $1 (e.g. osd.0) if it runs from this DIR, else fails. The pid file is
# written by the daemon; the command line must name our conf (pid reuse, foreign daemons).
daemon_pid() {
  local pid f=$DIR/run/$1.pid
  if [ -s "$f" ]; then
    pid=$(<"$f")
    if [[ $pid =~ ^[0-9]+$ ]] && is_our_daemon "$pid" "$1"; then
      echo "$pid"
      return 0
    fi
  fi
  # No (live) pid file: look for a process of ours anyway (a pid file removed by hand, or a
  # daemon that died between fork and writing it).
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    if is_our_daemon "$p" "$1"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# Whether pid $1 runs `ceph-<type> -c $CONF -i <id>` for daemon name $2 (type.id).
is_our_daemon() {
  local args=()
  mapfile -d "" -t args 2>/dev/null <"/proc/$1/cmdline" || return 1
  [ "${#args[@]}" -ge 5 ] && [ "${args[0]##*/}" = "ceph-${2%%.*}" ] &&
    [ "${args[1]}" = -c ] && [ "${args[2]}" = "$CONF" ] &&
    [ "${args[3]}" = -i ] && [ "${args[4]}" = "${2#*.}" ]
}

# Starts daemon $1 (type.id). Ceph daemonizes itself (fork, setsid, pid file); setsid here
# also detaches the short-lived parent. Early errors land in DIR/log/$1.out.
start_daemon() {
  local type=${1%%.*} id=${1#*.}
  local left=$((DEADLINE - SECONDS))
  [ "$left" -gt 0 ] || left=1
  local rc=0
  timeout "$left" setsid "ceph-$type" -c "$CONF" -i "$id" \
    </dev/null >>"$DIR/log/$1.out" 2>&1 || rc=$?
  [ "$rc" -ne 124 ] ||
    die "timed out (CEPH_START_TIMEOUT=${CEPH_START_TIMEOUT}s) starting ceph-$type -i $id"
  [ "$rc" -eq 0 ] ||
    die "ceph-$type -i $id failed to start (see $DIR/log/$1.log and $DIR/log/$1.out)"
}

# Stops daemon $1 with signal $2 (default TERM), waiting up to CEPH_STOP_TIMEOUT seconds,
# then SIGKILL. Succeeds when it is not running.
stop_daemon() {
  local name=$1 sig=${2:-TERM} pid i
  pid=$(daemon_pid "$name") || { rm -f "$DIR/run/$name.pid"; return 0; }
  log "stopping $name (pid $pid, SIG$sig)"
  kill -s "$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < CEPH_STOP_TIMEOUT * 10; i++)); do
    [ -d "/proc/$pid" ] && is_our_daemon "$pid" "$name" || break
    sleep 0.1
  done
  if [ -d "/proc/$pid" ] && is_our_daemon "$pid" "$name"; then
    log "$name did not exit within ${CEPH_STOP_TIMEOUT}s: SIGKILL"
    kill -s KILL "$pid" 2>/dev/null || true
    while [ -d "/proc/$pid" ] && is_our_daemon "$pid" "$name"; do sleep 0.1; done
  fi
  rm -f "$DIR/run/$name.pid"
}

stop_all() {
  local d
  for d in "${DAEMONS[@]}"; do stop_daemon "$d"; done
}

running_daemons() {
  local d out=()
  for d in "${DAEMONS[@]}"; do
    daemon_pid "$d" >/dev/null && out+=("$d")
  done
  echo "${out[*]:-}"
}

# ---------------------------------------------------------------------------------------
# Cluster queries

# The ceph CLI, bounded by what is left of the deadline (at most 60 s a call).
cephc() {
  local left=$((DEADLINE - SECONDS))
  [ "$left" -le 60 ] || left=60
  [ "$left" -ge 5 ] || left=5
  timeout "$left" ceph -c "$CONF" --connect-timeout "$left" "$@"
}

rbdc() {
  local left=$((DEADLINE - SECONDS))
  [ "$left" -le 60 ] || left=60
  [ "$left" -ge 5 ] || left=5
  timeout "$left" rbd -c "$CONF" "$@"
}

# Evaluates Python expression $1 on the JSON document on stdin (bound to d).
json() { "$PY" -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

# Runs "$@" until it succeeds; dies when the deadline passes.
wait_for() {
  local what=$1
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$DEADLINE" ] ||
      die "timed out after ${CEPH_START_TIMEOUT}s (CEPH_START_TIMEOUT) waiting for $what"
    sleep 0.5
  done
}

mon_answers() { cephc mon stat >/dev/null 2>&1; }

mgr_available() {
  [ "$(cephc mgr stat -f json 2>/dev/null | json 'd["available"]' 2>/dev/null)" = True ]
}

# osd.0's up_from epoch if the OSD map says it is up, else fails.
osd_up_from() {
  local r
  r=$(cephc osd dump -f json 2>/dev/null |
    json '[o["up_from"] for o in d["osds"] if o["osd"] == 0 and o["up"] == 1][0]' 2>/dev/null) ||
    return 1
  [[ $r =~ ^[0-9]+$ ]] && echo "$r"
}

osd_is_down() {
  [ "$(cephc osd dump -f json 2>/dev/null |
    json '[o["up"] for o in d["osds"] if o["osd"] == 0][0]' 2>/dev/null)" = 0 ]
}

# Whether there are PGs and every one is active+clean as reported by the OSD incarnation
# that came up at epoch $1: without that check, stats the mgr kept from before a restart
# could look active+clean while the PGs are still peering.
pgs_active_clean() {
  local r
  r=$(cephc pg ls -f json 2>/dev/null | json '
(lambda s: len(s) > 0 and all(p["state"] == "active+clean"
  and int(str(p["reported_epoch"]).split(":")[0]) >= '"$1"' for p in s))(
  d["pg_stats"] if isinstance(d, dict) else d)' 2>/dev/null) || return 1
  [ "$r" = True ]
}

rbd_works() {
  local img=ceph-single-node-probe-$$
  rbdc create "rbd/$img" --size 4M >/dev/null 2>&1 &&
    rbdc rm --no-progress "rbd/$img" >/dev/null 2>&1
}

# Waits until osd.0 is up and every PG is active+clean.
wait_osd_and_pgs() {
  wait_for "osd.0 to be up (log: $DIR/log/osd.0.log)" osd_up_from >/dev/null
  local up_from
  up_from=$(osd_up_from) || die "osd.0 went down again (log: $DIR/log/osd.0.log)"
  wait_for "all PGs to be active+clean" pgs_active_clean "$up_from"
}

# On a failed `start`/`start-osd`: shows the log tails and stops what runs.
on_failure() {
  local rc=$?
  [ "$rc" -ne 0 ] || return 0
  trap - EXIT
  local f
  for f in "$DIR"/log/*.log "$DIR"/log/*.out; do
    [ -s "$f" ] || continue
    echo "----- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
  if [ "$CMD" = start ]; then
    log "start failed: stopping what was started (the data stays in $DIR)"
    stop_all
  elif [ "$CMD" = start-osd ]; then
    log "start-osd failed: stopping osd.0"
    stop_daemon osd.0
  fi
  exit "$rc"
}

# ---------------------------------------------------------------------------------------
# Commands

write_conf() {
  cat >"$CONF" <<EOF
# Written by scripts/ceph-single-node.sh: a throw-away one-node test cluster.
[global]
fsid = $FSID
mon_host = [v2:127.0.0.1:$CEPH_MON_PORT,v1:127.0.0.1:$CEPH_MON_V1_PORT]
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
# Every client of this cluster is current; also silences the insecure-reclaim warning.
auth_allow_insecure_global_id_reclaim = false
ms_bind_ipv4 = true
ms_bind_ipv6 = false
run_dir = $DIR/run
crash_dir = $DIR/crash
# One OSD: one replica, failure domain "osd", no PG autoscaling (no PG splits mid-test).
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = $CEPH_PG_NUM
osd_pool_default_pgp_num = $CEPH_PG_NUM
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
# Never mark the OSD "out" while a test has it stopped (0 would mean never too, but warns).
mon_osd_down_out_interval = 86400
# The data lives in a shared /tmp: do not warn (or, at 5 %, stop the monitor) on low space.
mon_data_avail_warn = 1
mon_data_avail_crit = 0
# Only the mgr's always-on modules (no dashboard, restful, iostat, nfs).
mgr_initial_modules =
# A client killed with SIGKILL leaves its watch on the image header behind (librbd's
# exclusive lock is held through it) until the OSD times the watch out; the lock of a dead
# owner is broken only then, so a restarted client would wait 30 s (the default) to open
# the image for writing. 5 s lets it take the lock soon after. Clients must then ping their
# watches more often than every 5 s: see objecter_tick_interval below. In [global], not
# [osd]: dhrd bounds its read lease by the value its own configuration holds.
osd_client_watch_timeout = 5
# Fresher PG states (OSD -> mgr stats, mgr -> mon digest): a quicker start and start-osd.
mgr_stats_period = 1
mon_mgr_digest_period = 1

[mon]
mon_data = $DIR/mon/\$cluster-\$id
keyring = \$mon_data/keyring
log_file = $DIR/log/\$name.log
pid_file = $DIR/run/\$name.pid
admin_socket = $DIR/run/\$name.asok
mon_cluster_log_file = $DIR/log/\$cluster.\$channel.log

[mgr]
mgr_data = $DIR/mgr/\$cluster-\$id
keyring = \$mgr_data/keyring
log_file = $DIR/log/\$name.log
pid_file = $DIR/run/\$name.pid
admin_socket = $DIR/run/\$name.asok
public_addr = 127.0.0.1

[osd]
osd_data = $DIR/osd\$id
keyring = \$osd_data/keyring
log_file = $DIR/log/\$name.log
pid_file = $DIR/run/\$name.pid
admin_socket = $DIR/run/\$name.asok
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
osd_objectstore = bluestore
# BlueStore in one sparse file, \$osd_data/block, created by mkfs; RocksDB and its WAL
# share it. (bluestore_block_path stays unset: set, mkfs would make \$osd_data/block a
# symlink to it, and to itself if it named that same file.)
bluestore_block_create = true
bluestore_block_size = $CEPH_OSD_BYTES
bluestore_block_db_create = false
bluestore_block_wal_create = false
# The same tuning whatever the disk under DIR claims to be (virtual disks often say
# "rotational"): SSD allocation, throttling and no deferred (double) small writes.
bluestore_debug_enforce_settings = ssd
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 2
# A small machine shared with builds: a fixed 256 MiB BlueStore cache (the SSD default
# would be 3 GiB) and a 1 GiB memory target for the OSD.
bluestore_cache_autotune = false
bluestore_cache_size = 268435456
osd_memory_target = 1073741824
osd_crush_initial_weight = 1
[client]
keyring = $DIR/ceph.client.admin.keyring
# librados pings each watch once per objecter tick (5 s by default): a ping period equal
# to the 5 s watch timeout above leaves no margin for a busy client, so tick every second.
# (Measured: a restarted client takes over a SIGKILLed client's lock after about 6 s.)
objecter_tick_interval = 1
EOF
}

cmd_start() {
  local running
  if [ -e "$DIR" ]; then
    [ -d "$DIR" ] || die "$DIR exists and is not a directory"
    running=$(running_daemons)
    [ -z "$running" ] ||
      die "a cluster is already running in $DIR ($running): run '$0 stop $DIR' first"
    if [ -n "$(ls -A "$DIR")" ]; then
      [ -e "$MARKER" ] ||
        die "$DIR is not empty and was not made by this script: refusing to wipe it"
      log "wiping the stale cluster in $DIR"
      find "$DIR" -mindepth 1 -delete
    fi
  fi
  local port
  for port in "$CEPH_MON_PORT" "$CEPH_MON_V1_PORT"; do
    [ -z "$(ss -Hltn "sport = :$port")" ] ||
      die "port $port is in use (set CEPH_MON_PORT / CEPH_MON_V1_PORT)"
  done

  mkdir -p "$DIR"/{run,log,crash,mon,mgr/ceph-x,osd0}
  touch "$MARKER"
  trap on_failure EXIT

  FSID=$(cat /proc/sys/kernel/random/uuid)
  write_conf

  # Keys: the monitor's own, client.admin and mgr.x go into the monitor at mkfs time.
  local tmpkeys=$DIR/mon/initial.keyring
  ceph-authtool --create-keyring "$tmpkeys" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$DIR/ceph.client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  ceph-authtool --create-keyring "$DIR/mgr/ceph-x/keyring" --gen-key -n mgr.x \
    --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *' >/dev/null
  ceph-authtool "$tmpkeys" --import-keyring "$DIR/ceph.client.admin.keyring" >/dev/null
  ceph-authtool "$tmpkeys" --import-keyring "$DIR/mgr/ceph-x/keyring" >/dev/null

  monmaptool --create --fsid "$FSID" \
    --addv a "[v2:127.0.0.1:$CEPH_MON_PORT,v1:127.0.0.1:$CEPH_MON_V1_PORT]" \
    "$DIR/mon/monmap" >/dev/null
  ceph-mon -c "$CONF" -i a --mkfs --monmap "$DIR/mon/monmap" --keyring "$tmpkeys" \
    >>"$DIR/log/mon.a.out" 2>&1 || die "ceph-mon --mkfs failed (see $DIR/log/mon.a.out)"
  rm -f "$tmpkeys" "$DIR/mon/monmap"

  log "starting mon.a on 127.0.0.1:$CEPH_MON_PORT (v2) and :$CEPH_MON_V1_PORT (v1)"
  start_daemon mon.a
  wait_for "the monitor to answer (log: $DIR/log/mon.a.log)" mon_answers
  # Device health scraping (smartctl) means nothing for a file-backed OSD, and it would
  # create a second pool (device_health_metrics) at some moment after the OSD is up. A
  # module option is read from the monitor's config database, not from ceph.conf.
  cephc config set mgr mgr/devicehealth/enable_monitoring false --force >/dev/null ||
    die "ceph config set failed"
  start_daemon mgr.x

  # osd.0: registered with its key, then BlueStore's mkfs creates DIR/osd0/block.
  local osd_uuid osd_key
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  osd_key=$(ceph-authtool --gen-print-key)
  ceph-authtool --create-keyring "$DIR/osd0/keyring" -n osd.0 --add-key "$osd_key" >/dev/null
  printf '{"cephx_secret": "%s"}\n' "$osd_key" >"$DIR/osd0/new.json"
  local id
  id=$(cephc osd new "$osd_uuid" 0 -i "$DIR/osd0/new.json") || die "ceph osd new failed"
  rm -f "$DIR/osd0/new.json"
  [ "$id" = 0 ] || die "ceph osd new gave id '$id', expected 0"
  log "creating osd.0 (BlueStore in $DIR/osd0/block, $CEPH_OSD_BYTES bytes, sparse)"
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$DIR/log/osd.0.out" 2>&1 ||
    die "ceph-osd --mkfs failed (see $DIR/log/osd.0.out and $DIR/log/osd.0.log)"
  start_daemon osd.0
  wait_for "osd.0 to be up (log: $DIR/log/osd.0.log)" osd_up_from >/dev/null

  cephc osd pool create rbd "$CEPH_PG_NUM" "$CEPH_PG_NUM" replicated >/dev/null 2>&1 ||
    die "ceph osd pool create rbd failed"
  if [ "$(cephc osd pool get rbd size -f json | json 'd["size"]')" != 1 ]; then
    cephc osd pool set rbd size 1 --yes-i-really-mean-it >/dev/null 2>&1
  fi
  [ "$(cephc osd pool get rbd min_size -f json | json 'd["min_size"]')" = 1 ] ||
    cephc osd pool set rbd min_size 1 >/dev/null 2>&1
  rbdc pool init rbd || die "rbd pool init rbd failed"

  wait_for "the mgr to be active (log: $DIR/log/mgr.x.log)" mgr_available
  wait_osd_and_pgs
  wait_for "an rbd create/rm of a test image to succeed" rbd_works

  local health
  health=$(cephc health 2>/dev/null || true)
  [[ $health == HEALTH_OK* ]] || log "note: ceph health says: $health"
  trap - EXIT
  echo "$PROG: ready: $CONF"
}

cmd_stop() {
  if [ ! -d "$DIR" ]; then
    log "$DIR does not exist: nothing to stop"
    return 0
  fi
  stop_all
  log "stopped (data kept in $DIR)"
}

# Prints the running daemons of DIR; fails unless DIR holds a cluster whose monitor runs
# (the OSD commands need it to mark the OSD down or to peer).
need_monitor() {
  [ -f "$CONF" ] || die "no cluster in $DIR ($CONF missing)"
  local running
  running=$(running_daemons)
  [[ " $running " == *" mon.a "* ]] || die "the monitor of $DIR is not running"
  echo "$running"
}

cmd_stop_osd() {
  need_monitor >/dev/null
  stop_daemon osd.0 "$CEPH_OSD_STOP_SIGNAL"
  # A clean shutdown tells the monitor; after a crash (SIGKILL) we do, rather than wait
  # for the monitor's report timeout (15 min with a single OSD: it has no peers to report).
  if ! osd_is_down; then
    cephc osd down 0 >/dev/null 2>&1 || true
  fi
  wait_for "osd.0 to be marked down" osd_is_down
  log "osd.0 stopped"
}

cmd_start_osd() {
  local running
  running=$(need_monitor)
  if [[ " $running " == *" osd.0 "* ]]; then
    log "osd.0 is already running"
  else
    trap on_failure EXIT
    log "starting osd.0"
    start_daemon osd.0
  fi
  wait_osd_and_pgs
  trap - EXIT
  log "osd.0 up, all PGs active+clean"
}

case "$CMD" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  stop-osd) cmd_stop_osd ;;
  start-osd) cmd_start_osd ;;
  *) usage ;;
esac
