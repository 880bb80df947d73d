#!/usr/bin/env bash
# Re-attach of data already in the page cache: time to warm-up complete and daemon CPU,
# two binaries in alternating rounds. usage: reattach-ab.sh ROUNDS MODE old=BIN new=BIN
set -euo pipefail
rounds=$1 mode=$2; shift 2
base=/var/tmp/reattach-ab
if [ ! -e $base/ready ]; then
  rm -rf $base; mkdir -p $base/big $base/small
  head -c 1G /dev/urandom > $base/big/f
  python3 - <<'PY'
import os
for i in range(20000):
    d = "/var/tmp/reattach-ab/small/d%02d" % (i // 1000)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%05d" % (d, i), "wb") as f: f.write(os.urandom(16384))
PY
  sync; touch $base/ready
fi
cat $base/big/f > /dev/null; find $base/small -type f -exec cat {} + > /dev/null
echo "# reattach-ab $mode $(date -u +%FT%TZ) $*"
for r in $(seq $rounds); do
  specs=("$@"); [ $((r % 2)) = 0 ] && specs=($(printf '%s\n' "$@" | tac))
  for spec in "${specs[@]}"; do
    name=${spec%%=*} bin=${spec#*=}
    for set in big small; do
      pid=$($bin attach $base/$set --daemon --quiet --durability $mode 2>&1 | grep -o 'daemon [0-9]*' | grep -o '[0-9]*')
      while :; do
        s=$($bin status $base/$set --json)
        c=$(echo "$s" | python3 -c 'import json,sys; d=json.load(sys.stdin)["warmup"]; print(d["complete"], d["complete_after_s"], d["files_warmed"])')
        [ "${c%% *}" = True ] && break; sleep 0.05
      done
      ticks=$(awk '{print $14+$15}' /proc/$pid/stat)
      echo "round=$r bin=$name set=$set complete_after_s=$(echo $c | cut -d' ' -f2) files=$(echo $c | cut -d' ' -f3) daemon_ticks=$ticks"
      $bin detach $base/$set > /dev/null
      while [ -e /proc/$pid ]; do sleep 0.05; done
    done
  done
done
