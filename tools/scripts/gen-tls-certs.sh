#!/usr/bin/env bash
# Generates a test PKI for a Foreman cluster's mutual TLS (--tls-cert,
# --tls-key, --tls-ca): a CA and one certificate + private key per node name,
# signed by that CA. For tests and for trying a cluster out; a production
# cluster should use its organisation's CA.
#
# Usage: tools/scripts/gen-tls-certs.sh [--rogue NAME]... [--expired NAME]... OUT_DIR [NAMES...]
#   OUT_DIR        created if missing; gets ca.pem + ca.key and NAME.pem + NAME.key
#                  per NAME (default: one node called "node").
#   --rogue NAME   also a second, untrusted CA (rogue-ca.pem, rogue-ca.key) and
#                  NAME.pem + NAME.key signed by it: a certificate that a
#                  cluster using ca.pem must refuse.
#   --expired NAME also NAME.pem + NAME.key signed by ca.pem whose validity
#                  ended one day before it was made (notAfter < now).
# Keys are RSA 2048, unencrypted PEM (mode 600); certificates SHA-256, valid
# 3650 days, with subjectAltName IP:127.0.0.1 and DNS:localhost (CAF checks
# no host name, but other TLS tools do). Idempotent: an existing CA is kept, and
# an existing NAME.pem is kept when it still verifies against its CA (a
# rerun with new names adds them). Quiet unless something fails; exit 1 with
# openssl's message on failure, 2 on bad usage.
#
# The openssl commands it runs, for one CA and one node "node0":
#   openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out ca.key
#   openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj /CN=foreman-test-ca \
#       -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -out ca.pem
#   openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out node0.key
#   openssl req -new -key node0.key -subj /CN=node0 -out node0.csr
#   printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > node0.ext
#   openssl x509 -req -in node0.csr -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
#       -extfile node0.ext -out node0.pem
#   openssl verify -CAfile ca.pem node0.pem
# Every node of a cluster gets its own NAME.pem/NAME.key and the same ca.pem;
# ca.key stays with whoever signs (it is not needed by the nodes).
set -euo pipefail

usage() {
  sed -n '7,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

rogue=()
expired=()
while (($# > 0)); do
  case "$1" in
    --rogue) (($# >= 2)) || usage; rogue+=("$2"); shift 2 ;;
    --expired) (($# >= 2)) || usage; expired+=("$2"); shift 2 ;;
    -h|--help) usage ;;
    -*) echo "gen-tls-certs: unknown option '$1'" >&2; usage ;;
    *) break ;;
  esac
done
(($# >= 1)) || usage
out=$1
shift
names=("$@")
((${#names[@]} > 0)) || names=(node)
command -v openssl >/dev/null || { echo "gen-tls-certs: the openssl command is not installed (Debian: apt-get install openssl)" >&2; exit 1; }

valid_name='^[A-Za-z0-9][A-Za-z0-9_.-]*$'
for n in "${names[@]}" "${rogue[@]}" "${expired[@]}"; do
  [[ $n =~ $valid_name && $n != ca && $n != rogue-ca ]] ||
    { echo "gen-tls-certs: bad node name '$n' (letters, digits, '_', '.', '-'; not 'ca' or 'rogue-ca')" >&2; exit 2; }
done

mkdir -p "$out"
cd "$out"
umask 077
log=$(mktemp)
trap 'rm -f "$log" ./*.csr ./*.ext' EXIT

# run CMD...: runs openssl quietly; on failure prints its output and exits 1.
run() {
  if ! "$@" >"$log" 2>&1; then
    echo "gen-tls-certs: failed: $*" >&2
    cat "$log" >&2
    exit 1
  fi
}

new_key() { run openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1"; }

# make_ca NAME CN: NAME.pem + NAME.key, unless both exist.
make_ca() {
  [[ -s $1.pem && -s $1.key ]] && return 0
  new_key "$1.key"
  run openssl req -x509 -new -key "$1.key" -sha256 -days 3650 -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -out "$1.pem"
}

# make_cert NAME CA DAYS: NAME.pem + NAME.key signed by CA.pem, unless NAME.pem
# already verifies against CA.pem (an expired one never does: it is remade).
make_cert() {
  local name=$1 ca=$2 days=$3
  if [[ -s $name.pem && -s $name.key && $days -gt 0 ]] &&
     openssl verify -CAfile "$ca.pem" "$name.pem" >/dev/null 2>&1; then
    return 0
  fi
  new_key "$name.key"
  run openssl req -new -key "$name.key" -subj "/CN=$name" -out "$name.csr"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >"$name.ext"
  run openssl x509 -req -in "$name.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial -sha256 \
    -days "$days" -extfile "$name.ext" -out "$name.pem"
  rm -f "$name.csr" "$name.ext"
}

make_ca ca foreman-test-ca
for n in "${names[@]}"; do make_cert "$n" ca 3650; done
# -days -1: notAfter is one day before notBefore (now), so the certificate has expired.
for n in "${expired[@]}"; do make_cert "$n" ca -1; done
if ((${#rogue[@]} > 0)); then
  make_ca rogue-ca foreman-rogue-ca
  for n in "${rogue[@]}"; do make_cert "$n" rogue-ca 3650; done
fi
chmod 644 ./*.pem
