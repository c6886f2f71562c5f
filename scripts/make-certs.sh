#!/usr/bin/env bash
# Makes the certificates of a shardcache deployment with openssl: a CA, a server certificate for
# every store, and client certificates for each shard's replicators, an administrator and a reader.
#
#   scripts/make-certs.sh                       # into ./certs, for shard "a"
#   scripts/make-certs.sh -o DIR -s "a b c"     # shards a, b and c
#   scripts/make-certs.sh -o DIR --renew        # rotation: new leaf certificates, same CA
#   scripts/make-certs.sh -n cache-2 -e "etcd-1 etcd-2 etcd-3"   # a second cache, and etcd
#
# DIR then holds (keys are readable by their owner only; -m sets another mode):
#   ca.crt, ca.key              the CA (kept when present: every run reuses it)
#   server.crt, server.key      for every cache_server: names cache, localhost, 127.0.0.1, ::1,
#                               shard-<s> for each shard, and those given with -n
#   replicator-<s>.crt/.key     CN shardcache:replicator:<s>, O shardcache:replicators
#   admin.crt, admin.key        CN admin, O shardcache:admins
#   reader.crt, reader.key      CN reader, O shardcache:readers
#   etcd-server.crt/.key        with -e: for every etcd member named in -e (and localhost,
#                               127.0.0.1), for clients and peers (serverAuth and clientAuth)
#   etcd-client.crt/.key        with -e: CN shardcache:etcd-client, what cache_server
#                               (--etcd-cert) and etcdctl present to etcd
#
# -n and -e default to the environment's SHARDCACHE_CERT_NAMES and SHARDCACHE_CERT_ETCD_MEMBERS
# (a compose overlay adds names there: environments merge, commands do not).
#
# A certificate already in DIR is kept (the server's only while it names every shard's store and
# every -n name: adding a shard makes it again), unless --renew: then every certificate but the
# CA's is made again (new keys), written beside the old one and renamed into place, key first, so
# that a server or replicator that reloads its files (--tls-reload-interval) picks up the new
# pair without a restart. -d sets the validity in days (default 365; a negative number makes
# certificates that have already expired, for tests).
set -euo pipefail

OUT=certs
SHARDS="a"
EXTRA_NAMES="${SHARDCACHE_CERT_NAMES:-}"
ETCD_MEMBERS="${SHARDCACHE_CERT_ETCD_MEMBERS:-}"
DAYS=365
RENEW=0
KEY_MODE=600

usage() {
  sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -o) OUT="$2"; shift 2 ;;
    -s) SHARDS="$2"; shift 2 ;;
    -n) EXTRA_NAMES="$2"; shift 2 ;;
    -e) ETCD_MEMBERS="$2"; shift 2 ;;
    -d) DAYS="$2"; shift 2 ;;
    -m) KEY_MODE="$2"; shift 2 ;;
    --renew) RENEW=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "make-certs.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

command -v openssl >/dev/null || { echo "make-certs.sh: openssl is required" >&2; exit 2; }
for shard in $SHARDS; do
  if [[ ! "$shard" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]]; then
    echo "make-certs.sh: \"$shard\" is not a shard name (lower-case letters, digits, -)" >&2
    exit 2
  fi
done
for member in $ETCD_MEMBERS; do
  if [[ ! "$member" =~ ^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$ ]]; then
    echo "make-certs.sh: \"$member\" is not an etcd member's host name" >&2
    exit 2
  fi
done
mkdir -p "$OUT"
TMP="$(mktemp -d "$OUT/.make-certs.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

new_key() {  # new_key FILE: an EC P-256 private key
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
  chmod "$KEY_MODE" "$1"
}

if [[ ! -f "$OUT/ca.crt" || ! -f "$OUT/ca.key" ]]; then
  new_key "$TMP/ca.key"
  openssl req -x509 -new -key "$TMP/ca.key" -sha256 -days "$(( DAYS > 3650 ? DAYS : 3650 ))" \
    -subj "/CN=shardcache CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$TMP/ca.crt" 2>/dev/null
  mv "$TMP/ca.key" "$OUT/ca.key"
  mv "$TMP/ca.crt" "$OUT/ca.crt"
  echo "made $OUT/ca.crt"
fi

# covers_names CERT SAN: whether CERT's subjectAltName holds every name of SAN ("DNS:x,IP:y").
covers_names() {
  local cert="$1" entry
  local -a entries
  IFS=, read -ra entries <<< "$2"
  for entry in "${entries[@]}"; do
    case "$entry" in
      DNS:*) openssl x509 -in "$cert" -noout -checkhost "${entry#DNS:}" | grep -q 'does match' ;;
      IP:*) openssl x509 -in "$cert" -noout -checkip "${entry#IP:}" | grep -q 'does match' ;;
    esac || return 1
  done
}

# leaf NAME SUBJECT USAGE [SAN]: NAME.crt and NAME.key signed by the CA. A certificate that is
# kept must still name everything in SAN: one that lacks a name (a shard added with -s, a name
# added with -n) is made again.
leaf() {
  local name="$1" subject="$2" usage="$3" san="${4:-}"
  if [[ "$RENEW" == 0 && -f "$OUT/$name.crt" && -f "$OUT/$name.key" ]]; then
    if [[ -z "$san" ]] || covers_names "$OUT/$name.crt" "$san"; then return; fi
  fi
  new_key "$TMP/$name.key"
  openssl req -new -key "$TMP/$name.key" -subj "$subject" -out "$TMP/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    if [[ -n "$san" ]]; then echo "subjectAltName=$san"; fi
  } > "$TMP/$name.ext"
  openssl x509 -req -in "$TMP/$name.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" \
    -CAcreateserial -CAserial "$TMP/ca.srl" -sha256 -days "$DAYS" -extfile "$TMP/$name.ext" \
    -out "$TMP/$name.crt" 2>/dev/null
  mv "$TMP/$name.key" "$OUT/$name.key"
  mv "$TMP/$name.crt" "$OUT/$name.crt"
  echo "made $OUT/$name.crt ($subject)"
}

SAN="DNS:cache,DNS:localhost,IP:127.0.0.1,IP:::1"
for shard in $SHARDS; do SAN="$SAN,DNS:shard-$shard"; done
for name in $EXTRA_NAMES; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then SAN="$SAN,IP:$name"; else SAN="$SAN,DNS:$name"; fi
done
leaf server "/CN=shardcache server" serverAuth "$SAN"
for shard in $SHARDS; do
  leaf "replicator-$shard" "/O=shardcache:replicators/CN=shardcache:replicator:$shard" clientAuth
done
leaf admin "/O=shardcache:admins/CN=admin" clientAuth
leaf reader "/O=shardcache:readers/CN=reader" clientAuth
if [[ -n "$ETCD_MEMBERS" ]]; then
  # One certificate for every member, for both sides of its peer connections as well as for its
  # clients: etcd's --peer-cert-file is presented when it dials a peer too.
  ETCD_SAN="DNS:localhost,IP:127.0.0.1"
  for member in $ETCD_MEMBERS; do ETCD_SAN="$ETCD_SAN,DNS:$member"; done
  leaf etcd-server "/CN=shardcache etcd" serverAuth,clientAuth "$ETCD_SAN"
  leaf etcd-client "/CN=shardcache:etcd-client" clientAuth
fi
