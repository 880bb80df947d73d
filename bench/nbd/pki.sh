# Sourced by the TLS benchmarks: make_pki DIR CLIENT_HOME CA_NAME makes a CA and a server
# certificate for localhost with certtool (as docs/nbd.md shows) in DIR, the files
# `dhrd nbd --tls-certificates DIR` reads, and puts the CA where libnbd looks for it under
# CLIENT_HOME (the clients run with HOME=CLIENT_HOME). Keys are made private to the owner.
make_pki() {
  local pki=$1 home=$2 name=$3
  mkdir -p "$pki" "$home/.pki/libnbd"
  certtool --generate-privkey --outfile "$pki/ca-key.pem" 2>/dev/null
  printf 'cn = %s\nca\ncert_signing_key\nexpiration_days = 30\n' "$name" > "$pki/ca.info"
  certtool --generate-self-signed --load-privkey "$pki/ca-key.pem" --template "$pki/ca.info" \
    --outfile "$pki/ca-cert.pem" 2>/dev/null
  certtool --generate-privkey --outfile "$pki/server-key.pem" 2>/dev/null
  printf 'cn = localhost\ndns_name = localhost\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 30\n' \
    > "$pki/server.info"
  certtool --generate-certificate --load-ca-certificate "$pki/ca-cert.pem" \
    --load-ca-privkey "$pki/ca-key.pem" --load-privkey "$pki/server-key.pem" \
    --template "$pki/server.info" --outfile "$pki/server-cert.pem" 2>/dev/null
  cp "$pki/ca-cert.pem" "$home/.pki/libnbd/"
  chmod 600 "$pki"/*key.pem
}
