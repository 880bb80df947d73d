set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
WORK=$(mktemp -d /var/tmp/dhrd-tls-profile.XXXXXX); echo "perf data in $WORK"
source $ROOT/bench/nbd/pki.sh
make_pki "$WORK/pki" "$WORK/home" "p CA" >/dev/null 2>&1
head -c $((256 << 20)) /dev/urandom > "$WORK/data.img"
$ROOT/target/release/dhrd nbd --backing "$WORK/data.img" --socket "$WORK/s.sock" --status-file "$WORK/status" \
  --tls on --tls-certificates "$WORK/pki" >"$WORK/dhrd.log" 2>&1 &
PID=$!
for _ in $(seq 1 400); do [ -S "$WORK/s.sock" ] && break; sleep 0.05; done
sleep 3
for way in plain tls; do
 uri="nbd+unix:///?socket=$WORK/s.sock"; [ $way = tls ] && uri="nbds+unix:///?socket=$WORK/s.sock"
 perf record -q -o $WORK/perf-$way.data -p $PID -g -- sleep 4 >/dev/null 2>&1 &
 PP=$!
 HOME=$WORK/home fio --name=c --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=1 --size=256M --time_based --runtime=5 --norandommap --output-format=terse | awk -F';' '{print "'$way' iops", $8, "lat_mean_us", $40}'
 wait $PP || true
done
kill $PID; wait
