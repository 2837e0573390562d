#!/bin/bash
# The etcd campaign of docs/findings.md (issue 15): one tidal-chaos run at a
# time, 5 minutes each, rotating through nemesis/workload pairs, until the
# file $STOP exists. Runs 0-4 of the recorded campaign used --interval 5s
# --fault-duration 4s and the first five pairs of MIXES_0; runs 5-10 the
# rest of MIXES_0 with the timing below; runs 11- used MIXES_1.
# Usage: docs/findings/etcd-campaign.sh [mixes-set] (from the repository root,
# after make build). Fault-minutes: docs/findings/faultmin.py STORE.
set -u
BIN=${BIN:-bin/tidal-chaos}
STORE=${STORE:-store/etcd-campaign/runs}
STOP=${STOP:-store/etcd-campaign/STOP}
LOG=${LOG:-store/etcd-campaign/campaign.log}
MIXES_0=(
  "partition,kill,pause register linearizable"
  "partition append linearizable"
  "kill,restart register linearizable"
  "pause,transfer append linearizable"
  "membership,partition register linearizable"
  "slow,kill append linearizable"
  "all register serializable"
  "partition,pause register linearizable"
  "membership,kill append linearizable"
  "all register linearizable"
)
MIXES_1=(
  "membership append linearizable"
  "partition,kill,pause register linearizable"
  "membership register linearizable"
  "kill,restart append linearizable"
  "pause,transfer register linearizable"
  "partition append linearizable"
  "slow,kill register linearizable"
)
if [ "${1:-1}" = 0 ]; then mixes=("${MIXES_0[@]}"); else mixes=("${MIXES_1[@]}"); fi
mkdir -p "$(dirname "$LOG")"
i=0
while [ ! -e "$STOP" ]; do
  set -- ${mixes[$((i % ${#mixes[@]}))]}
  echo "=== run $i $(date -u +%FT%TZ) nemesis=$1 workload=$2 reads=$3" >> "$LOG"
  "$BIN" run --db etcd --test etcd-campaign --nodes 3 --nemesis "$1" --workload "$2" --reads "$3" \
     --duration 5m --interval 4s --fault-duration 3500ms --rate 200 --concurrency 16 --store "$STORE" --keep-runs 0 >> "$LOG" 2>&1
  echo "=== exit $? $(date -u +%FT%TZ)" >> "$LOG"
  i=$((i+1))
done
