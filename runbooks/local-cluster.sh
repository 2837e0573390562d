#!/usr/bin/env bash
# local-cluster.sh: a tidal cluster of real processes on this machine, to try
# the runbooks on by hand. The runbook suite (suites/runbook) uses this same
# script, so what a person types here is what the suite runs.
#
#   runbooks/local-cluster.sh [--insecure] DIR [NODES [SLOTS]]
#
# writes DIR/env.sh and starts nothing. NODES (default 3) is the initial
# cluster; SLOTS (default 5) is how many node slots get addresses, so that
# nodes can be added (slot i: data in DIR/n<i>/data, logs in DIR/n<i>/). Then:
#
#   source DIR/env.sh      # the variables and functions the runbooks use
#   tidal_cluster_up       # start nodes 1..NODES and wait for a leader
#   ...                    # follow a runbook
#   tidal_cluster_down     # stop every node this DIR started
#
# Ports: client 127.0.0.1:$((TIDAL_BASE_PORT+i)), peer
# 127.0.0.1:$((TIDAL_BASE_PORT+100+i)), TIDAL_BASE_PORT defaulting to 27000.
# TIDAL_PORTS="client1 peer1 client2 peer2 ..." (port numbers, one pair per
# slot) overrides them; the suite passes ports it found free.
#
# Secured, as production runs (both planes TLS, every request
# authenticated): the script makes, with `tidal-server certs` and `tokens`,
#
#   DIR/ca/ca.key             the CA key: the operator's safe, never on a node
#   DIR/certs/                $TIDAL_CERTS, the operator's client directory:
#                             ca.crt, client.{admin,writer,reader}.crt/key,
#                             app.token (the secret of token "app", writer)
#   DIR/tokens                $TIDAL_TOKENS, the tokens file (hashes only)
#   DIR/n<i>/certs/           node i's --certs-dir: ca.crt, node.crt/key for
#                             member i (initial nodes), and its copy of the
#                             tokens file (--tokens)
#
# and every URL is https://. A slot added later (a new member id) needs its
# own node.crt: the runbooks show that step (tidal-server certs create-node).
# --insecure writes a plaintext cluster instead (http://, no certificates,
# $TIDAL_CERTS empty), to compare.
#
# Needs Linux (bash, setsid, GNU date) and curl.
#
# Other settings read from the environment when the file is written:
#   TIDAL_BIN    directory holding tidal-server (default: the repository's bin/)
#   TIDAL_FLAGS  extra `tidal-server run` flags for every node
#   TIDAL_RELEASE_OLD  directory of the tidal-server release nodes run
#                unless tidal_install gave a slot another (default: TIDAL_BIN);
#                for runbooks/rolling-upgrade.md, the release to upgrade from
#   TIDAL_RELEASE_NEW  directory of the release to upgrade to (default: TIDAL_BIN)
set -euo pipefail

usage() {
	echo "usage: $0 [--insecure] DIR [NODES [SLOTS]]" >&2
	exit 2
}
secure=1
if [ "${1:-}" = --insecure ]; then
	secure=
	shift
fi
[ $# -ge 1 ] && [ $# -le 3 ] || usage
dir=$1
nodes=${2:-3}
slots=${3:-5}
case "$nodes$slots" in *[!0-9]*) usage ;; esac
if [ "$nodes" -lt 1 ] || [ "$slots" -lt "$nodes" ]; then
	echo "$0: expected 1 <= NODES <= SLOTS, found NODES=$nodes SLOTS=$slots" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
bin=${TIDAL_BIN:-$(cd "$here/.." && pwd)/bin}
if [ ! -x "$bin/tidal-server" ]; then
	echo "$0: $bin/tidal-server not found or not executable (run \`make build\`, or set TIDAL_BIN)" >&2
	exit 2
fi
release_old=${TIDAL_RELEASE_OLD:-$bin} release_new=${TIDAL_RELEASE_NEW:-$bin}
for r in "$release_old" "$release_new"; do
	if [ ! -x "$r/tidal-server" ]; then
		echo "$0: $r/tidal-server (TIDAL_RELEASE_OLD or TIDAL_RELEASE_NEW) not found or not executable" >&2
		exit 2
	fi
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
base=${TIDAL_BASE_PORT:-27000}
read -r -a ports <<<"${TIDAL_PORTS:-}"
if [ ${#ports[@]} -ne 0 ] && [ ${#ports[@]} -ne $((2 * slots)) ]; then
	echo "$0: TIDAL_PORTS: expected $((2 * slots)) ports (client and peer per slot), found ${#ports[@]}" >&2
	exit 2
fi

scheme=http certs= cakey= tokens=
if [ -n "$secure" ]; then
	scheme=https certs=$dir/certs cakey=$dir/ca/ca.key tokens=$dir/tokens
	# A fresh set every time: a directory written before (by another run of
	# this script) must not mix two CAs.
	rm -rf "$dir/ca" "$certs" "$tokens"
	for i in $(seq 1 "$slots"); do rm -rf "$dir/n$i/certs"; done
	mkdir -p "$dir/ca" "$certs"
	chmod 700 "$dir/ca" "$certs"
	"$bin/tidal-server" certs create-ca --certs-dir "$certs" --ca-key "$cakey" >/dev/null
	for role in admin writer reader; do
		"$bin/tidal-server" certs create-client "$role" --role "$role" --certs-dir "$certs" --ca-key "$cakey" >/dev/null
	done
	(umask 077 && "$bin/tidal-server" tokens add app --role writer --file "$tokens" >"$certs/app.token" 2>/dev/null)
	for i in $(seq 1 "$nodes"); do
		mkdir -p "$dir/n$i/certs"
		chmod 700 "$dir/n$i/certs"
		cp "$certs/ca.crt" "$tokens" "$dir/n$i/certs/"
		"$bin/tidal-server" certs create-node --id "$i" --host 127.0.0.1,localhost --certs-dir "$dir/n$i/certs" --ca-key "$cakey" >/dev/null
	done
fi

{
	echo "# tidal cluster in $dir, written by runbooks/local-cluster.sh on $(date -u +%FT%TZ)."
	echo "# source it, then: tidal_cluster_up"
	printf 'export TIDAL_WORK=%q\n' "$dir"
	printf 'export TIDAL_BIN=%q\n' "$bin"
	echo "# Security: empty for a plaintext (--insecure) cluster."
	printf 'export TIDAL_CERTS=%q TIDAL_CA_KEY=%q TIDAL_TOKENS=%q\n' "$certs" "$cakey" "$tokens"
	printf 'export TIDAL_FLAGS=%q\n' "${TIDAL_FLAGS:-}"
	echo "# Releases: what nodes run unless tidal_install says otherwise, and what an upgrade installs."
	printf 'export TIDAL_RELEASE_OLD=%q TIDAL_RELEASE_NEW=%q\n' "$(cd "$release_old" && pwd)" "$(cd "$release_new" && pwd)"
	printf 'export PATH=%q:"$PATH"\n' "$bin"
	echo "export TIDAL_NODES=$nodes TIDAL_SLOTS=$slots"
	for i in $(seq 1 "$slots"); do
		if [ ${#ports[@]} -ne 0 ]; then
			client=${ports[$((2 * i - 2))]} peer=${ports[$((2 * i - 1))]}
		else
			client=$((base + i)) peer=$((base + 100 + i))
		fi
		echo "export TIDAL_NODE$i=$scheme://127.0.0.1:$client TIDAL_PEER$i=127.0.0.1:$peer"
		printf 'export TIDAL_DATA%d=%q\n' "$i" "$dir/n$i/data"
	done
	cat <<'EOF'

# ---- functions: how this machine starts and stops a node --------------------
# In production your service manager does this; these stand in for it. Each
# node's process runs in its own session (a Ctrl-C here does not reach it),
# its pid is in $TIDAL_WORK/n<i>/pid, its output in n<i>/stdout.log and its
# log in n<i>/node.log; n<i>/events records every start, stop and exit.

# tidal_url I, tidal_addr I, tidal_peer I, tidal_data I: slot I's client
# URL ($TIDAL_NODE<I>), client host:port, peer host:port ($TIDAL_PEER<I>)
# and data directory ($TIDAL_DATA<I>).
tidal_url() { local v="TIDAL_NODE$1"; echo "${!v}"; }
tidal_addr() { local v="TIDAL_NODE$1"; echo "${!v#*://}"; }
tidal_peer() { local v="TIDAL_PEER$1"; echo "${!v}"; }
tidal_data() { local v="TIDAL_DATA$1"; echo "${!v}"; }

# tidal_node_certs I: slot I's --certs-dir (ca.crt, node.crt/key naming the
# member that runs there, and the node's copy of the tokens file). In
# production it lives on node I's machine.
tidal_node_certs() { echo "$TIDAL_WORK/n$1/certs"; }

# tidal_secured: true when the cluster runs with certificates.
tidal_secured() { [ -n "$TIDAL_CERTS" ]; }

# tidal_pid I: the pid of slot I's tidal-server (fails if none runs).
tidal_pid() {
	tidal_alive "$1" || { echo "tidal_pid: node $1 is not running" >&2; return 1; }
	cat "$TIDAL_WORK/n$1/pid"
}

# tidal_status [I]: `tidal-server status` of node I, or of the first node
# that answers: for people to read. Scripts read tidal_members.
tidal_status() {
	if [ $# -gt 0 ]; then
		tidal-server status --addr "$(tidal_url "$1")" --certs-dir "$TIDAL_CERTS" --timeout 5s
		return
	fi
	local i
	for i in $(seq 1 "$TIDAL_SLOTS"); do
		tidal-server status --addr "$(tidal_url "$i")" --certs-dir "$TIDAL_CERTS" --timeout 2s 2>/dev/null && return 0
	done
	echo "tidal_status: no node answered" >&2
	return 1
}

# tidal_members [I]: one line per member, "ID ROLE PEER MATCH LAG
# REACHABLE" (the status table without its CLIENT column, which is not
# always known). ROLE is leader, follower or learner. MATCH, LAG (commit
# index - match) and REACHABLE are the leader's view: without I, they are
# what the current leader reports (waiting up to 30s for a node that says
# it leads); with I, what node I reports, and "-" unless node I leads.
tidal_members() {
	local out slot deadline=$((SECONDS + 30))
	if [ $# -gt 0 ]; then
		out=$(tidal_status "$1") || return 1
	else
		while :; do
			slot=$(tidal_leader 2>/dev/null) && out=$(tidal_status "$slot" 2>/dev/null) &&
				[ "$(echo "$out" | awk 'NR == 1 { print ($2 == $4) }')" = 1 ] && break
			if [ $SECONDS -ge $deadline ]; then
				echo "tidal_members: no node answered as leader in 30s" >&2
				return 1
			fi
			sleep 0.2
		done
	fi
	echo "$out" | awk '
		NR == 1 { leads = ($2 == $4) }
		$1 ~ /^[0-9]+$/ && NF >= 6 {
			if (leads) print $1, $2, $3, $(NF-2), $(NF-1), $NF
			else print $1, $2, $3, "-", "-", "-"
		}'
}

# _tidal_rows: "ID ROLE PEER" of every member, from the first node that
# answers (what the lookups below need; no leader required).
_tidal_rows() {
	local out
	out=$(tidal_status) || return 1
	echo "$out" | awk '$1 ~ /^[0-9]+$/ && NF >= 6 { print $1, $2, $3 }'
}

# _tidal_leader_rows: _tidal_rows as the node named leader reports them, if
# it answers and says it leads (a node that is behind may not know the
# newest members yet).
_tidal_leader_rows() {
	local id slot out
	id=$(tidal_status 2>/dev/null | awk 'NR == 1 { print $4 }')
	[ -n "$id" ] && [ "$id" != 0 ] || return 1
	slot=$(tidal_slot_of "$id" 2>/dev/null) || return 1
	out=$(tidal_status "$slot" 2>/dev/null) || return 1
	[ "$(echo "$out" | awk 'NR == 1 { print ($2 == $4) }')" = 1 ] || return 1
	echo "$out" | awk '$1 ~ /^[0-9]+$/ && NF >= 6 { print $1, $2, $3 }'
}

# _tidal_initial_peers: the initial cluster 1..TIDAL_NODES as --peers.
_tidal_initial_peers() {
	local j p peers=
	for j in $(seq 1 "$TIDAL_NODES"); do
		p="TIDAL_PEER$j"
		peers="$peers${peers:+,}$j=${!p}"
	done
	echo "$peers"
}

# tidal_id_of I: the member id of slot I (the member at its peer address).
tidal_id_of() {
	local p="TIDAL_PEER$1" id
	id=$(_tidal_rows | awk -v p="${!p}" '$3 == p { print $1 }')
	if [ -z "$id" ]; then
		echo "tidal_id_of: no member has node $1's peer address ${!p}" >&2
		return 1
	fi
	echo "$id"
}

# tidal_slot_of ID: the slot whose peer address member ID has.
tidal_slot_of() {
	local peer i p
	peer=$(_tidal_rows | awk -v id="$1" '$1 == id { print $3 }')
	for i in $(seq 1 "$TIDAL_SLOTS"); do
		p="TIDAL_PEER$i"
		if [ -n "$peer" ] && [ "${!p}" = "$peer" ]; then
			echo "$i"
			return 0
		fi
	done
	echo "tidal_slot_of: member $1 (peer address ${peer:-unknown}) is in no slot" >&2
	return 1
}

# tidal_leader: the slot of the current leader, once the node named leader
# says so itself (waits up to 30s).
tidal_leader() {
	local id slot deadline=$((SECONDS + 30))
	while :; do
		id=$(tidal_status 2>/dev/null | awk 'NR == 1 { print $4 }') || true
		if [ -n "$id" ] && [ "$id" != 0 ] && slot=$(tidal_slot_of "$id" 2>/dev/null) &&
			[ "$(tidal_status "$slot" 2>/dev/null | awk 'NR == 1 { print ($2 == $4) }')" = 1 ]; then
			echo "$slot"
			return 0
		fi
		if [ $SECONDS -ge $deadline ]; then
			echo "tidal_leader: no leader after 30s" >&2
			return 1
		fi
		sleep 0.2
	done
}

# tidal_alive I: true while slot I's process (per its pid file) runs.
tidal_alive() {
	local pid data
	pid=$(cat "$TIDAL_WORK/n$1/pid" 2>/dev/null) || return 1
	data="TIDAL_DATA$1"
	# The pid must still be this node's tidal-server: pids are reused.
	ps -o args= -p "$pid" 2>/dev/null | grep -qF -- "--data-dir ${!data}"
}

# tidal_start I [--id ID] [--join] [--peers LIST] [run flags...]: start
# slot I. Without --id the node takes the id the membership lists at its
# peer address (a restart); with --id it starts as that member (one just
# added with `tidal-server members add`, which also needs --join). Its
# --peers is LIST when given (a node of another cluster, e.g. a restored
# one), else the membership as the nodes report it, else the initial
# cluster 1..TIDAL_NODES when no node answers (then --id is required).
# On a secured cluster the node runs with --certs-dir $(tidal_node_certs I)
# and --tokens $(tidal_node_certs I)/tokens: its node.crt must name the
# member it starts as (the node refuses another, naming both).
tidal_start() {
	local i=$1 id="" join="" members peers="" dir peer client data pid
	shift
	while [ $# -gt 0 ]; do
		case $1 in
		--id) id=$2; shift 2 ;;
		--join) join=--join; shift ;;
		--peers) peers=$2; shift 2 ;;
		*) break ;;
		esac
	done
	if tidal_alive "$i"; then
		echo "tidal_start: node $i already runs (pid $(cat "$TIDAL_WORK/n$i/pid"))" >&2
		return 1
	fi
	dir=$TIDAL_WORK/n$i peer="TIDAL_PEER$i" data="TIDAL_DATA$i"
	peer=${!peer} data=${!data}
	client=$(tidal_url "$i")
	client=${client#*://}
	if [ -n "$peers" ]; then
		if [ -z "$id" ]; then
			echo "tidal_start: --peers needs --id" >&2
			return 1
		fi
	elif members=$(_tidal_leader_rows 2>/dev/null || _tidal_rows 2>/dev/null) && [ -n "$members" ]; then
		peers=$(echo "$members" | awk '{ printf "%s%s=%s", sep, $1, $3; sep = "," }')
		if [ -z "$id" ]; then
			id=$(echo "$members" | awk -v p="$peer" '$3 == p { print $1 }')
		fi
		if [ -z "$id" ]; then
			echo "tidal_start: no member has node $i's peer address $peer; add it first (tidal-server members add)" >&2
			return 1
		fi
	else
		# No node answers: the initial cluster seeds the address book (a
		# node with data keeps the membership it stored).
		peers=$(_tidal_initial_peers)
		if [ -z "$id" ]; then
			echo "tidal_start: no node answers, so node $i's member id is unknown; give it: tidal_start $i --id ID" >&2
			return 1
		fi
	fi
	mkdir -p "$dir"
	rm -f "$dir/pid"
	if tidal_secured; then
		set -- --certs-dir "$(tidal_node_certs "$i")" --tokens "$(tidal_node_certs "$i")/tokens" "$@"
	fi
	# shellcheck disable=SC2086 # TIDAL_FLAGS is a list of flags
	set -- "$(tidal_release "$i")/tidal-server" run --id "$id" --peers "$peers" --client-addr "$client" \
		--peer-addr "$peer" --data-dir "$data" --log-file "$dir/node.log" $join $TIDAL_FLAGS "$@"
	echo "$*" >"$dir/cmdline"
	echo "node $i: $*"
	# The wrapper waits for the node so that its exit status is recorded.
	# It must not source anything a caller's BASH_ENV names.
	BASH_ENV= setsid bash -c '
		dir=$1; shift
		echo "=== $(date -u +%FT%T.%NZ) start $*" >>"$dir/stdout.log"
		"$@" >>"$dir/stdout.log" 2>&1 </dev/null &
		pid=$!
		echo "start $pid $(date +%s%N) id=$4" >>"$dir/events"
		echo $pid >"$dir/pid.tmp" && mv "$dir/pid.tmp" "$dir/pid"
		status=0
		wait $pid || status=$?
		echo "exit $pid $(date +%s%N) status=$status" >>"$dir/events"
		echo "=== $(date -u +%FT%T.%NZ) exit: pid $pid status $status" >>"$dir/stdout.log"
	' tidal-node "$dir" "$@" </dev/null >/dev/null 2>&1 &
	local waited=0
	until pid=$(cat "$dir/pid" 2>/dev/null); do
		sleep 0.05
		waited=$((waited + 1))
		if [ $waited -gt 200 ]; then
			echo "tidal_start: node $i wrote no pid file in 10s" >&2
			return 1
		fi
	done
	echo "node $i: started as member $id, pid $pid"
}

# tidal_install I DIR: install DIR/tidal-server as slot I's binary, run
# from its next start (in production: your package manager, or the image
# tag of its container). tidal_release I prints the directory slot I's
# next start runs: the one installed, else $TIDAL_RELEASE_OLD.
tidal_install() {
	local i=$1 release
	if ! release=$(cd "$2" 2>/dev/null && pwd) || [ ! -x "$release/tidal-server" ]; then
		echo "tidal_install: $2/tidal-server not found or not executable" >&2
		return 1
	fi
	mkdir -p "$TIDAL_WORK/n$i"
	echo "$release" >"$TIDAL_WORK/n$i/release"
	echo "node $i: installed $("$release/tidal-server" --version)"
}
tidal_release() {
	cat "$TIDAL_WORK/n$1/release" 2>/dev/null || echo "$TIDAL_RELEASE_OLD"
}

# tidal_stop I: SIGTERM slot I's process and wait for it to exit (it drains
# in-flight writes and hands leadership off); SIGKILL after
# ${TIDAL_STOP_TIMEOUT:-30} seconds.
tidal_stop() {
	local i=$1 dir=$TIDAL_WORK/n$1 pid waited=0
	if ! tidal_alive "$i"; then
		echo "node $i is not running"
		return 0
	fi
	pid=$(cat "$dir/pid")
	echo "stop $pid $(date +%s%N)" >>"$dir/events"
	kill -TERM "$pid"
	while tidal_alive "$i"; do
		sleep 0.1
		waited=$((waited + 1))
		if [ $waited -ge $((${TIDAL_STOP_TIMEOUT:-30} * 10)) ]; then
			echo "node $i (pid $pid) did not exit ${TIDAL_STOP_TIMEOUT:-30}s after SIGTERM; sending SIGKILL"
			echo "kill $pid $(date +%s%N)" >>"$dir/events"
			kill -KILL "$pid" 2>/dev/null || true
			waited=0
		fi
	done
	echo "node $i stopped (pid $pid)"
}

# tidal_cluster_up: start nodes 1..TIDAL_NODES as the initial cluster and
# wait (${TIDAL_UP_TIMEOUT:-60} seconds at most) until every one answers
# /readyz. Every node is given the whole initial cluster as --peers: a node
# that has just bootstrapped may report only part of it while it applies.
tidal_cluster_up() {
	local i n peers
	peers=$(_tidal_initial_peers)
	for i in $(seq 1 "$TIDAL_NODES"); do
		tidal_alive "$i" || tidal_start "$i" --id "$i" --peers "$peers"
	done
	for i in $(seq 1 "$TIDAL_NODES"); do
		n=0
		until curl -sf --cacert "$TIDAL_CERTS/ca.crt" "$(tidal_url "$i")/readyz" >/dev/null; do
			sleep 0.2
			n=$((n + 1))
			if [ $n -ge $((${TIDAL_UP_TIMEOUT:-60} * 5)) ]; then
				echo "tidal_cluster_up: node $i not ready after ${TIDAL_UP_TIMEOUT:-60}s; see $TIDAL_WORK/n$i/node.log" >&2
				return 1
			fi
		done
	done
	"$TIDAL_BIN/tidal-server" status --addr "$(tidal_url 1)" --certs-dir "$TIDAL_CERTS"
}

# tidal_cluster_down: stop every slot's process.
tidal_cluster_down() {
	local i
	for i in $(seq 1 "$TIDAL_SLOTS"); do
		tidal_stop "$i"
	done
}
EOF
} >"$dir/env.sh.tmp"
mv "$dir/env.sh.tmp" "$dir/env.sh"
echo "wrote $dir/env.sh; next: source $dir/env.sh && tidal_cluster_up"
