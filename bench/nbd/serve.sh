# Sourced by the NBD benchmarks. serve_start BIN DISK SOCK LOG [ARGS...] starts `BIN nbd`
# serving DISK on the Unix socket SOCK (its output appended to LOG) and returns once its
# load into RAM is done, with its pid in SERVER_PID; it prints the log and fails when the
# server exits first. serve_stop stops it (nothing when none runs).
serve_loads() { # LOG: loads finished so far by that log (every start appends to it)
  grep -c "loaded .* bytes into RAM" "$1" 2>/dev/null || true
}
serve_start() {
  local bin=$1 disk=$2 sock=$3 log=$4 want
  shift 4
  # Counted before the start, so a load that finishes at once is not missed.
  want=$(( $(serve_loads "$log") + 1 ))
  rm -f "$sock"
  "$bin" nbd --backing "$disk" --socket "$sock" "$@" >> "$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 6000); do
    [ "$(serve_loads "$log")" -ge "$want" ] && return 0
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
