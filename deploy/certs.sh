#!/usr/bin/env bash
# Make the certificates of a 3-node deployment with tidal-server certs:
#   DIR/ca.key                 the CA key (keep it off the nodes)
#   DIR/ca/                    ca.crt and client.admin.crt/key (for clients)
#   DIR/tidal-N/               ca.crt, node.crt, node.key of member N
# Node certificates name tidal-N, tidal-N.tidal-peers (the StatefulSet's
# peer names), tidal (the client Service), localhost and 127.0.0.1; add
# --host for other names with EXTRA_HOSTS="a,b".
#
#   deploy/certs.sh deploy/certs        # for deploy/compose.yaml
#   deploy/certs.sh deploy/k8s/certs    # for kubectl apply -k deploy/k8s
#
# Run as root, the node directories are given to uid 65532, the image's
# user (a key is readable by its owner only); otherwise it says how.
set -euo pipefail
dir=${1:?usage: deploy/certs.sh DIR}
bin=${TIDAL_SERVER:-bin/tidal-server}
[ -x "$bin" ] || { echo "certs.sh: $bin not found: make build (or set TIDAL_SERVER)" >&2; exit 1; }
mkdir -p "$dir/ca"
"$bin" certs create-ca --certs-dir "$dir/ca" --ca-key "$dir/ca.key"
"$bin" certs create-client admin --role admin --certs-dir "$dir/ca" --ca-key "$dir/ca.key"
for i in 1 2 3; do
  mkdir -p "$dir/tidal-$i"
  cp "$dir/ca/ca.crt" "$dir/tidal-$i/"
  "$bin" certs create-node --certs-dir "$dir/tidal-$i" --ca-key "$dir/ca.key" --id "$i" \
    --host "tidal-$i,tidal-$i.tidal-peers,tidal,localhost,127.0.0.1${EXTRA_HOSTS:+,$EXTRA_HOSTS}"
done
if [ "$(id -u)" = 0 ]; then
  chown -R 65532:65532 "$dir"/tidal-1 "$dir"/tidal-2 "$dir"/tidal-3
else
  echo "certs.sh: now give the node directories to the image's user: sudo chown -R 65532:65532 $dir/tidal-{1,2,3}" >&2
fi
