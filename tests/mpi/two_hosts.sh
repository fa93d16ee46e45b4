#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# two_hosts.sh PROGRAM: runs PROGRAM under mpirun on two "hosts" — two network namespaces
# joined by a bridge, 2 ranks each, real TCP between them (docs/multi-worker.md#tests).
# Needs root with CAP_NET_ADMIN (ip netns), iproute2 and util-linux (unshare); prints a SKIP
# line and exits 77 (Meson: skipped) where it cannot create the namespaces.
set -u
program=$(readlink -f "$1")
skip() { echo "SKIP: two-host MPI test NOT run: $*" >&2; exit 77; }
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (apt-get install openmpi-bin)"
command -v ip >/dev/null 2>&1 || skip "ip not found (apt-get install iproute2)"
command -v unshare >/dev/null 2>&1 || skip "unshare not found (apt-get install util-linux)"
[ "$(id -u)" = 0 ] || skip "needs root (CAP_NET_ADMIN) for ip netns"

# Unique names, so two runs never collide; everything is removed on exit.
tag=mw$$
bridge=${tag}br
work=$(mktemp -d)
hosts=("${tag}A" "${tag}B")
cleanup() {
  for h in "${hosts[@]}"; do
    ip link set "v$h" up 2>/dev/null
    ip netns del "$h" 2>/dev/null
    ip link del "v$h" 2>/dev/null
  done
  ip link del "$bridge" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "${hosts[0]}" 2>/dev/null || skip "ip netns add failed (no CAP_NET_ADMIN here)"
ip netns del "${hosts[0]}"

# 198.18.0.0/15 is reserved for network benchmarks (RFC 2544): no real network of the machine
# is routed there, so the bridge cannot shadow one.
net=198.$((RANDOM % 2 + 18)).$((RANDOM % 250)).0
prefix=${net%.0}
ip link add "$bridge" type bridge || skip "cannot create a bridge"
ip addr add "$prefix.1/24" dev "$bridge" && ip link set "$bridge" up || skip "cannot configure the bridge"
i=11
for h in "${hosts[@]}"; do
  ip netns add "$h" || skip "ip netns add $h failed"
  ip link add "v$h" type veth peer name eth0 netns "$h" || skip "cannot create a veth pair"
  ip link set "v$h" master "$bridge" up
  ip -n "$h" addr add "$prefix.$i/24" dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$h" link set lo up
  i=$((i + 1))
done

# Can A reach B at all? A TCP connect to a closed port is refused at once where packets flow;
# it times out where a firewall filters bridged traffic (Docker hosts set FORWARD to DROP with
# br_netfilter): then skip, instead of an mpirun that hangs until the timeout.
probe=$(timeout 3 ip netns exec "${hosts[0]}" bash -c "exec 3<>/dev/tcp/$prefix.12/9" 2>&1)
if [ $? -eq 124 ]; then
  skip "the two namespaces cannot reach each other over the bridge (a firewall on bridged traffic?)"
fi
case $probe in *refused*|'') ;; *) skip "probe between the namespaces failed: $probe" ;; esac

# Stands in for ssh: $1 = host = namespace name, the rest = the orted command line.
cat > "$work/nsrsh" <<'EOS'
#!/bin/sh
h=$1; shift
exec ip netns exec "$h" unshare --uts sh -c "hostname $h; $*"
EOS
chmod +x "$work/nsrsh"

. "$(dirname "$0")/mpi_env.sh"  # root, containers, sanitizer options (as run_mpi.sh)
timeout -k 10 120 mpirun --allow-run-as-root --bind-to none --oversubscribe \
  --host "${hosts[0]}:2,${hosts[1]}:2" -np 4 --mca plm_rsh_agent "$work/nsrsh" \
  --mca oob_tcp_if_include "$net/24" --mca btl_tcp_if_include "$net/24" \
  "$program"
