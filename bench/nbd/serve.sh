# Sourced by the NBD benchmarks. serve_start BIN DISK SOCK LOG [ARGS...] starts `BIN nbd`
# serving DISK on the Unix socket SOCK (its output in LOG, emptied first) and returns once
# its load into RAM is done, with its pid in SERVER_PID; it prints the log and fails when
# the server exits first. serve_stop stops it (nothing when none runs).
serve_start() {
  local bin=$1 disk=$2 sock=$3 log=$4
  shift 4
  rm -f "$sock"
  : > "$log"
  "$bin" nbd --backing "$disk" --socket "$sock" "$@" >> "$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 6000); do
    grep -q "loaded .* bytes into RAM" "$log" && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$log"
  return 1
}
serve_stop() {
  if [ -n "${SERVER_PID:-}" ]; then
    kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=
}
