#!/usr/bin/env bash
# The cluster test: one leaf-spine run spread over three containers with
# `qaina-bench up --cluster` (Mininet's cluster edition), checked for exact sums and for
# nothing left in any container or on this machine.
#
# * a Docker daemon of its own (socket, data and exec roots under a temporary
#   directory, as docker/smoke.sh; no default bridge, no iptables rules), stopped at
#   the end with everything it made;
# * the project's image (Dockerfile) plus sshd (docker/cluster.Dockerfile); an ssh key
#   and the servers' host keys made for this run only;
# * three containers qb-a, qb-b, qb-c on an INTERNAL Docker network (no route out of
#   this machine), each with only its own disk (no shared results directory); the run
#   starts on qb-a with --cluster localhost,qb-b,qb-c: lf1 and its hosts on qb-a, lf2
#   and its hosts on qb-b, the spines on qb-c, the leaf-spine links ssh -w tunnels;
#   what the remote switches and agents write comes back to qb-a over ssh, and the
#   result set there must hold all of it, with nothing of it left on qb-b or qb-c.
# * where this machine has BMv2 and p4c on PATH, the same run with --target bmv2
#   (BMv2 switches on every server): the containers get this machine's build
#   bind-mounted read-only (simple_switch_grpc, simple_switch_CLI, p4c, p4c-bm2-ss,
#   /usr/local/lib, /usr/local/share/p4c) and the image BMv2's Debian runtime
#   libraries; the kill -9 case then runs BMv2 too. Elsewhere it says why it skips.
# * with TORCH (make cluster-test passes the Makefile's), the image gets the torch
#   wheel this machine's pip takes for it (docker/torch.Dockerfile) and the DDP example
#   runs with --train-script across the servers; without one, it says why it skips.
# * two runs with --cli: a ping from qb-b's host, a process left there recorded under
#   qb-b and stopped at teardown, or by clean after a kill -9 at the prompt.
# * a held run whose spines' server (qb-c) is frozen (docker pause) before Ctrl-C: the
#   teardown ends and names qb-c, and clean removes what it left there once qb-c runs.
# Run as root: make cluster-test
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=qaina-bench:cluster-base
IMAGE=qaina-bench:cluster
NET=qbcluster
SUBNET=${QB_CLUSTER_SUBNET:-10.213.50.0/24}
SERVERS=(qb-a qb-b qb-c)
NAME=cluster-test WORK_PREFIX=qaina-cluster
. docker/daemon.sh

cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    docker rm -f "${SERVERS[@]}" >/dev/null 2>&1 || true
    docker network rm "$NET" >/dev/null 2>&1 || true
  fi
  daemon_stop
}
trap cleanup EXIT

need_root_and ssh-keygen:openssh-client
daemon_start
base_image

# This machine's BMv2 build, read-only in every container (nothing of it is copied
# into an image), or why the BMv2 scenario is skipped.
bmv2= bmv2_mounts=() held_target=embedded
for tool in simple_switch_grpc simple_switch_CLI p4c p4c-bm2-ss; do
  command -v "$tool" >/dev/null || { bmv2="skipped: $tool is not on PATH here"; break; }
done
if [ -z "$bmv2" ] && [ "$(dirname "$(command -v simple_switch_grpc)")" != /usr/local/bin ]; then
  bmv2="skipped: this BMv2 is not a /usr/local build ($(command -v simple_switch_grpc))"
fi
if [ -z "$bmv2" ]; then
  bmv2=yes held_target=bmv2
  bmv2_mounts=(-v /usr/local/bin/simple_switch_grpc:/opt/bmv2/simple_switch_grpc:ro
               -v /usr/local/lib:/usr/local/lib:ro -v /usr/local/share/p4c:/usr/local/share/p4c:ro)
  for tool in simple_switch_CLI p4c p4c-bm2-ss; do
    bmv2_mounts+=(-v "/usr/local/bin/$tool:/usr/local/bin/$tool:ro")
  done
fi

# PyTorch for the --train-script run: the wheel this machine's pip takes for TORCH (the
# Makefile's, torch==2.13.0: the CPU build), in a build context of its own, or why that
# run is skipped.
torch=
if [ -z "${TORCH:-}" ]; then
  torch="skipped: TORCH is empty (make cluster-test TORCH=torch==2.13.0 runs it)"
elif ! python3 -m venv "$work/pip" >"$work/torch.log" 2>&1 \
    || ! "$work/pip/bin/pip" download -q --no-deps -d "$work/torch" "$TORCH" \
         ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} >>"$work/torch.log" 2>&1 \
    || ! ls "$work"/torch/torch-*.whl >/dev/null 2>&1; then
  torch="skipped: pip here does not give a torch wheel for $TORCH ($(tail -n 1 "$work/torch.log"))"
else
  torch=yes
fi

say "building $BASE and $IMAGE"
docker build --network host -t "$BASE" . >"$work/build.log" 2>&1 \
  || { tail -n 30 "$work/build.log" >&2; exit 1; }
docker build --network host -t "$IMAGE" -f docker/cluster.Dockerfile \
  --build-arg BMV2=$([ "$bmv2" = yes ] && echo 1 || echo 0) docker \
  >>"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; exit 1; }
if [ "$torch" = yes ]; then
  say "adding $(basename "$work"/torch/torch-*.whl) to $IMAGE"
  docker build --network host -t "$IMAGE" -f docker/torch.Dockerfile "$work/torch" \
    >>"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; exit 1; }
  rm -rf "$work/torch" "$work/pip"
fi

say "three servers on the internal network $NET ($SUBNET)"
docker network create --internal --subnet "$SUBNET" "$NET" >/dev/null
mkdir -p "$work/key"
ssh-keygen -q -t ed25519 -N '' -C qaina-cluster-test -f "$work/key/id_ed25519"
cat >"$work/key/config" <<'CONFIG'
Host *
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
CONFIG
for s in "${SERVERS[@]}"; do
  docker run -d --name "$s" --hostname "$s" --network "$NET" \
    --cap-add=NET_ADMIN --cap-add=SYS_ADMIN --device /dev/net/tun \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    "${bmv2_mounts[@]}" "$IMAGE" >/dev/null
  if [ "$bmv2" = yes ]; then  # on PATH by a link (the test removes it from one server)
    docker exec "$s" sh -c 'ln -s /opt/bmv2/simple_switch_grpc /usr/local/bin/ && ldconfig -X'
  fi
  docker cp "$work/key/id_ed25519" "$s:/root/.ssh/id_ed25519"
  docker cp "$work/key/id_ed25519.pub" "$s:/root/.ssh/authorized_keys"
  docker cp "$work/key/config" "$s:/root/.ssh/config"
  docker exec "$s" sh -c 'chown root:root /root/.ssh/* && chmod 600 /root/.ssh/*'
done
A=(docker exec -w /opt/qaina-bench qb-a)
AI=(docker exec -i -w /opt/qaina-bench qb-a)  # with stdin: the checks read their script from it
for s in "${SERVERS[@]:1}"; do  # every server's sshd up (a loaded machine is slow)
  for _ in $(seq 100); do "${A[@]}" ssh -o BatchMode=yes "$s" true 2>/dev/null && break; sleep 0.2; done
done

say "doctor --cluster"
"${A[@]}" .venv/bin/qaina-bench doctor --cluster localhost,qb-b,qb-c | grep -E "qb-|localhost"

logins() { docker logs "$1" 2>&1 | grep -c 'Accepted publickey' || true; }
say "a leaf-spine run, 2 jobs x 4 workers, over the three servers, 2% loss on every link"
# (the kernel has no netem: the loss is nftables rules on every server, tunnels included)
before=$(logins qb-c)
flock /tmp/qb-mininet.lock "${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c \
  --topo leafspine --jobs 2 --workers 4 --iterations 2 --record-levels --loss 2 \
  --results-dir /results --run-id cluster ${QB_CLUSTER_ARGS:-}
# Sessions share connections (harness/running/sshmux.py): qb-c (the spines) takes a
# login for the check before the run, one for short commands, one for its 6 lasting
# sessions (2 node shells, 2 switches, the follower, the sampler) and one per tunnel
# (4): 7, where a login per session made 34.
n=$(( $(logins qb-c) - before ))
[ "$n" -le 9 ] || { echo "  $n ssh logins to qb-c in one run: sessions did not share connections" >&2; exit 1; }
echo "  $n ssh logins to qb-c in the run"

say "checking: placement, exact sums, nothing left"
"${AI[@]}" .venv/bin/python - <<'CHECK'
import json, sys
sys.path.insert(0, "tests")
from cluster_check import checked_run
run, summary, where = checked_run("cluster")
assert where["lf1"] == "localhost" and where["lf2"] == "qb-b", where
assert where["sp1"] == where["sp2"] == "qb-c", where
assert all(where[f"h{i}"] == ("localhost" if i % 2 else "qb-b") for i in range(1, 9)), where
retx = sum(j["retransmissions"] for j in summary["jobs"])
assert summary["links"]["loss_percent"] == 2.0 and retx > 0, (summary["links"], retx)
loss = summary["link_loss"]  # the rules' counters, read on every server
assert loss["by"] == "nftables" and "error" not in loss and loss["lost"] > 0, loss
spines = [c["frames"] for i, c in loss["interfaces"].items() if i.startswith("sp")]
assert spines and any(spines), loss["interfaces"]  # qb-c's rules were read too
print(f"  exact sums: {len(summary['jobs'])} jobs x {summary['iterations']} iterations "
      f"({retx} retransmissions at 2% loss); placement {where}")
# every agent's records and log (empty unless it failed), every switch's log and port
# counters (written as it stopped), from whichever server ran it
agents = [f"j{j}w{w}" for j in (1, 2) for w in range(4)]
files = ([f"agents/{a}.jsonl" for a in agents] + [f"logs/{sw}.log" for sw in ("lf1", "lf2", "sp1", "sp2")]
         + [f"logs/{sw}.stats.json" for sw in ("lf1", "lf2", "sp1", "sp2")])
missing = [p for p in files if not (run / p).is_file() or not (run / p).stat().st_size]
missing += [f"logs/agent-{a}.log" for a in agents if not (run / f"logs/agent-{a}.log").is_file()]
assert not missing, f"not in the result set on qb-a: {missing}"
offsets = summary["clock_offsets"]
assert set(offsets) == {"qb-b", "qb-c"} and all(o["samples"] for o in offsets.values()), offsets
import csv
servers = {r["server"] for r in csv.DictReader(open(run / "timeseries.csv", newline=""))}
assert {"", "qb-b", "qb-c"} <= servers, servers
print("  clock offsets: " + ", ".join(f"{k} {1e3 * v['offset_s']:+.1f} ms (round trip "
                                       f"{1e3 * v['round_trip_s']:.0f} ms)" for k, v in offsets.items()))
done = [a for a in agents if any(json.loads(line).get("type") == "done"
                                 for line in (run / f"agents/{a}.jsonl").read_text().splitlines())]
assert done == agents, f"agents whose done record is missing: {set(agents) - set(done)}"
assert not summary["errors"], summary["errors"]
print(f"  result set on qb-a: {len(agents)} agents' records and logs, 4 switch logs")
cost = summary["cpu_cost"]  # its share is of every server's cores, each kernel once:
by = cost["cores_by_server"]  # the three containers run on this machine's kernel
assert set(by) == {"localhost", "qb-b", "qb-c"}, cost
assert cost["shared_kernel"] == {"qb-b": "localhost", "qb-c": "localhost"}, cost
assert cost["cores"] == by["localhost"] and "softirq_by_server" not in cost["kernel"], cost
print(f"  CPU cost: {cost['total_s']:.1f} CPU s on {cost['cores']} cores {by}, one kernel")
CHECK
# Nothing of a run left: no interface but lo and eth0, no Mininet shell, switch, agent
# or tunnel, no run record, in any container; no tap device here.
nothing_left() {
  local left=0 s links procs records
  for s in "${SERVERS[@]}"; do
    links=$(docker exec "$s" ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 \
      | grep -vxE 'lo|eth0' || true)
    procs=$(docker exec "$s" ps -eo pid=,args= \
      | grep -E 'mnexec|qaina_bench|qaina-bench|ssh .*-w|ssh .*-M -N|bash --norc' | grep -v grep || true)
    procs=$procs$(docker exec "$s" ps -eo pid=,args= | grep simple_switch | grep -v grep || true)
    records=$(docker exec "$s" sh -c 'ls /run/qaina-bench/*.json 2>/dev/null; ls -d /tmp/qaina-bench-* 2>/dev/null' || true)
    if [ "$s" != qb-a ]; then  # the run's directory lives on qb-a only
      records="$records$(docker exec "$s" sh -c 'ls -d /results 2>/dev/null' || true)"
    fi
    records=$records$(docker exec "$s" sh -c 'nft list tables 2>/dev/null | grep qaina_' || true)
    if [ -n "$links$procs$records" ]; then
      left=1; echo "  left on $s ($1): ${links//$'\n'/ } ${procs//$'\n'/; } $records" >&2
    fi
  done
  ip -o link show tap9 >/dev/null 2>&1 && { echo "  left on this machine: tap9" >&2; left=1; }
  [ "$left" -eq 0 ] || exit 1
  echo "  nothing left ($1)"
}
nothing_left "after the run"

say "a trace set only on qb-a, outside the project; --pcap on nodes of qb-b and qb-c"
"${A[@]}" .venv/bin/qaina-bench traces record mine --out /tmp/qb-traces --model mlp \
  --workers 4 --iterations 2 >/dev/null
for s in qb-b qb-c; do
  docker exec "$s" test ! -e /tmp/qb-traces || { echo "  $s has /tmp/qb-traces" >&2; exit 1; }
done
flock /tmp/qb-mininet.lock "${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c \
  --topo leafspine --jobs 1 --workers 4 --iterations 2 --record-levels \
  --trace /tmp/qb-traces/mine --pcap h2,lf2,sp1 --results-dir /results --run-id cluster-inputs
"${AI[@]}" .venv/bin/python - <<'CHECK'
import json, sys
sys.path.insert(0, "tests")
from cluster_check import checked_run
from test_pcap_runs import decode
run, summary, where = checked_run("cluster-inputs")
assert (where["h2"], where["lf2"], where["sp1"]) == ("qb-b", "qb-b", "qb-c"), where
config = json.loads((run / "agents" / "j1w1.json").read_text())  # h2's agent, on qb-b
assert config["trace"] == "/results/cluster-inputs/.inputs/mine", config["trace"]
assert not (run / ".inputs").exists(), "the trace copy came back with the results"
captures = json.loads((run / "pcap" / "captures.json").read_text())
files = {f["file"]: f for f in captures["files"]}
suffix = ".pcapng" if captures["tool"] == "dumpcap" else ".pcap"
remote = [f for f in files.values() if f.get("server")]
assert {f["server"] for f in remote} == {"qb-b", "qb-c"}, files
assert {f["node"] for f in remote} == {"h2", "lf2", "sp1"}, files
per_node = {}
for f in remote:  # every UDP frame decodes as QAINA (decode checks), of job 1
    path = run / "pcap" / f["file"]
    assert path.is_file() and path.stat().st_size == f["bytes"] > 0, (f, path)
    packets = decode(run, f["interface"], suffix)
    assert all(p["job_id"] == 1 for p in packets), f["file"]
    per_node[f["node"]] = per_node.get(f["node"], 0) + len(packets)
assert all(per_node[n] > 0 for n in ("h2", "lf2", "sp1")), per_node
print(f"  exact sums with the trace set of qb-a only; {len(remote)} captures of qb-b and "
      f"qb-c in the result set, QAINA packets decoded per node {per_node}")
CHECK
nothing_left "after the trace and --pcap run"
for s in qb-b qb-c; do
  docker exec "$s" test ! -e /tmp/qb-traces || { echo "  $s has /tmp/qb-traces" >&2; exit 1; }
done

# --host-cpu: Docker mounts a container's cgroups read-only; each container gets its
# own cgroup (v1: cpu, cpuacct, cpuset) read-write where Mininet's tools and mnexec -g
# look (/sys/fs/cgroup/<controller>), by a bind mount of it over that path.
writable_cgroups() {
  local s
  for s in "${SERVERS[@]}"; do
    docker exec "$s" sh -c 'for h in cpu cpuacct cpuset; do
        own=$(sed -n "s/^[0-9]*:$h:\(.*\)/\1/p" /proc/self/cgroup)
        mkdir -p /run/cg-$h && mount -t cgroup -o $h cgroup /run/cg-$h \
          && mount --bind "/run/cg-$h$own" /sys/fs/cgroup/$h && umount /run/cg-$h || exit 1
      done' || { echo "  $s: cannot make its cgroups writable" >&2; exit 1; }
  done
}
say "--host-cpu 0.5 over the three servers: every host limited on its own server"
out=$("${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-b --host-cpu 0.5 \
  --results-dir /results 2>&1 && exit 1 || true)  # read-only cgroups there: refused
echo "  up before: $out"
[ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "qb-b: --host-cpu makes a cgroup" \
  || exit 1
writable_cgroups
# h2's agent on qb-b and its cgroup's quota, watched until the run has ended (however
# long the run waits for the test lock)
docker exec -d qb-b sh -c 'while [ ! -e /tmp/h2-run-ended ]; do
    for p in $(cat /sys/fs/cgroup/cpu/h2/tasks 2>/dev/null); do
      if grep -qs qaina_bench.hosts.agent /proc/$p/cmdline; then
        cat /sys/fs/cgroup/cpu/h2/cpu.cfs_quota_us /sys/fs/cgroup/cpu/h2/cpu.cfs_period_us \
          > /tmp/h2-quota; exit 0
      fi
    done; sleep 0.1; done'
flock /tmp/qb-mininet.lock "${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c \
  --topo leafspine --jobs 1 --workers 2 --iterations 2 --record-levels --host-cpu 0.5 \
  --results-dir /results --run-id cluster-cpu
docker exec qb-b touch /tmp/h2-run-ended
"${AI[@]}" .venv/bin/python - <<'CHECK'
import sys
sys.path.insert(0, "tests")
from cluster_check import checked_run
run, summary, where = checked_run("cluster-cpu")
assert where["h2"] == "qb-b" and summary["host_cpu"] == 0.5, (where, summary["host_cpu"])
print(f"  exact sums with every host at 0.5 cores; placement {where}")
CHECK
quota=$(docker exec qb-b cat /tmp/h2-quota 2>/dev/null | tr '\n' ' ')
[ "$quota" = "50000 100000 " ] || { echo "  h2's agent on qb-b: cgroup quota/period '$quota'" >&2; exit 1; }
echo "  h2's agent on qb-b ran in cgroup h2 there: quota 50000 us per 100000 us"
for s in "${SERVERS[@]}"; do
  left=$(docker exec "$s" sh -c 'ls -d /sys/fs/cgroup/cpu*/h[0-9]* 2>/dev/null' || true)
  [ -z "$left" ] || { echo "  cgroups left on $s: $left" >&2; exit 1; }
done
nothing_left "after the --host-cpu run"

if [ "$torch" = yes ]; then
  # PyTorch hidden on a server, as if it lacked it (its package directory renamed)
  torch_dir=$(docker exec qb-a /opt/qaina-bench/.venv/bin/python -c \
    'import os, torch; print(os.path.dirname(torch.__file__))')
  hide_torch() { docker exec "$1" mv "$torch_dir" "$torch_dir.off"; }
  show_torch() { docker exec "$1" mv "$torch_dir.off" "$torch_dir"; }
  say "--train-script over the three servers: the DDP example, h2's worker on qb-b"
  hide_torch qb-b
  out=$("${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c --topo leafspine \
    --jobs 1 --workers 2 --train-script examples/ddp_digits.py --results-dir /results 2>&1 \
    && exit 1 || true)  # a server with hosts and no PyTorch: refused
  echo "  up with no PyTorch on qb-b: $out"
  [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "qb-b: --train-script needs PyTorch there" \
    || exit 1
  show_torch qb-b
  hide_torch qb-c  # the spines' server runs no script: it needs no PyTorch
  flock /tmp/qb-mininet.lock "${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c \
    --topo leafspine --jobs 1 --workers 2 --iterations 4 --record-levels \
    --train-script examples/ddp_digits.py \
    --results-dir /results --run-id cluster-script
  show_torch qb-c
  "${AI[@]}" .venv/bin/python - <<'CHECK'
import csv, sys
sys.path.insert(0, "tests")
from cluster_check import checked_run
run, summary, where = checked_run("cluster-script")
assert (where["h1"], where["h2"], where["sp1"]) == ("localhost", "qb-b", "qb-c"), where
assert summary["jobs"][0]["iterations_done"] == 4, summary["jobs"][0]
rows = list(csv.DictReader(open(run / "iterations.csv")))
assert sorted((int(r["worker"]), int(r["iteration"])) for r in rows) == \
    [(w, i) for w in range(2) for i in range(4)], rows
for w in range(2):  # each worker's script output, qb-b's too, in the result set on qb-a
    log = (run / "logs" / f"script-j1w{w}.log").read_text()
    assert f"rank {w} (" in log and "test accuracy" in log, log[-2000:]
assert (run / "script" / "ddp_digits.py").is_file()
print(f"  exact sums of the DDP buckets over 4 steps; rank 1 on qb-b; placement {where}")
CHECK
  nothing_left "after the --train-script run"
else
  say "--train-script scenario $torch"
fi

say "--cli over the three servers: a ping and a process of qb-b's host, then kill -9 and clean"
flock /tmp/qb-mininet.lock "${AI[@]}" .venv/bin/python - <<'CHECK'
import json, subprocess, sys
from pathlib import Path
sys.path.insert(0, "tests")
from cluster_check import checked_run
from test_mncli import CLI, PROMPT, Session

def alive(pid: int) -> bool:  # on qb-b
    return subprocess.run(["ssh", "qb-b", f"kill -0 {pid}"], capture_output=True).returncode == 0

def started_on_qb_b(run_id: str, what: str) -> int:
    rec = json.loads(Path(f"/run/qaina-bench/{run_id}.json").read_text())
    there = [p for p in rec["servers"]["qb-b"]["processes"] if p["what"] == what]
    assert len(there) == 1, rec["servers"]["qb-b"]["processes"]
    assert alive(there[0]["pid"]), there
    return there[0]["pid"]

def session(run_id: str) -> Session:
    s = Session(Path("/results"), run_id, "--topo", "leafspine", "--cluster",
                "localhost,qb-b,qb-c", "--record-levels", "--cli", "before")
    assert s.pump(lambda: PROMPT in s.out, 180), s.out
    return s

s = session("cluster-cli")
s.send("h2 ping -c1 -W5 h1")  # from qb-b's host to qb-a's, through the tunnels
assert "1 received" in s.out, s.out[-2000:]
s.send("h2 sleep 321 &")
pid = started_on_qb_b("cluster-cli", "started in the CLI: sleep 321")
assert s.leave("exit") == 0, s.out[-3000:]
assert f"sleep 321 (pid {pid} on qb-b)" in s.out, s.out[-3000:]
run, summary, where = checked_run("cluster-cli")
assert where["h2"] == "qb-b" and not alive(pid), (where, pid)
print(f"  ping h2 (qb-b) -> h1 (qb-a); sleep 321 on qb-b recorded as pid {pid}, stopped "
      "at teardown; the jobs then ran exact")

s = session("cluster-cli-kill")
s.send("h2 nohup sleep 322 > /dev/null 2>&1 &")  # outlives its shell
pid = started_on_qb_b("cluster-cli-kill", "started in the CLI: sleep 322")
s.proc.kill()
s.proc.wait(30)
r = subprocess.run(CLI + ["clean"], capture_output=True, text=True, timeout=300)
assert r.returncode == 0 and f"stopped started in the CLI: sleep 322 (pid {pid})" in r.stdout, \
    r.stdout + r.stderr
assert not alive(pid), pid
print(f"  kill -9 at the prompt: clean stopped sleep 322 (pid {pid}) on qb-b")
CHECK
nothing_left "after the --cli runs"

if [ "$bmv2" = yes ]; then
  say "BMv2: doctor --cluster --target bmv2"
  "${A[@]}" .venv/bin/qaina-bench doctor --cluster localhost,qb-b,qb-c --target bmv2 \
    | grep -E "qb-.*(BMv2|simple_switch_CLI|nft)"
  say "BMv2: a leaf-spine run, 1 job x 4 workers, BMv2 switches on the three servers"
  flock /tmp/qb-mininet.lock "${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c \
    --target bmv2 --topo leafspine --jobs 1 --workers 4 --iterations 2 --record-levels \
    --results-dir /results --run-id cluster-bmv2
  "${AI[@]}" .venv/bin/python - <<'CHECK'
import sys
sys.path.insert(0, "tests")
from cluster_check import checked_run
run, summary, where = checked_run("cluster-bmv2")
assert (where["lf1"], where["lf2"], where["sp1"]) == ("localhost", "qb-b", "qb-c"), where
for sw in ("lf1", "lf2", "sp1", "sp2"):  # each switch's log is simple_switch_grpc's
    text = (run / "logs" / f"{sw}.log").read_text()
    assert "Adding interface" in text, (sw, text[-500:])
print(f"  exact sums on BMv2: {len(summary['jobs'])} job x {summary['iterations']} "
      f"iterations; placement {where}")
CHECK
  nothing_left "after the BMv2 run"
  say "BMv2: every switch on qb-b and qb-c, the harness on qb-a without BMv2 or p4c on PATH"
  # (nothing of BMv2 or p4c is found here: simple_switch_grpc is not required, and the
  # program compiles with a switch's server's p4c, the compile cache here emptied first)
  docker exec qb-a sh -c 'rm -rf /root/.cache/qaina-bench/p4c; printf "%s\n" \
    "servers: [localhost, qb-b, qb-c]" "pin: {lf1: qb-b, lf2: qb-c}" >/tmp/remote-switches.yaml'
  flock /tmp/qb-mininet.lock "${A[@]}" env PATH=/opt/qaina-bench/.venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    .venv/bin/qaina-bench up --cluster /tmp/remote-switches.yaml --target bmv2 \
    --topo leafspine --jobs 1 --workers 4 --iterations 2 --record-levels \
    --results-dir /results --run-id cluster-bmv2-remote
  "${AI[@]}" .venv/bin/python - <<'CHECK'
import sys
sys.path.insert(0, "tests")
from cluster_check import checked_run
run, summary, where = checked_run("cluster-bmv2-remote")
assert (where["lf1"], where["lf2"], where["sp1"]) == ("qb-b", "qb-c", "qb-c"), where
assert "localhost" not in where.values(), where
p4c = summary["switch_program"]["p4c"]
assert p4c["server"] in ("qb-b", "qb-c") and p4c["version"], summary["switch_program"]
print(f"  exact sums on BMv2 with no switch on qb-a: compiled with p4c on {p4c['server']} "
      f"({p4c['version']}); placement {where}")
CHECK
  for s in qb-b qb-c; do  # p4c's temporary directory there is gone
    left=$(docker exec "$s" sh -c 'ls -d /tmp/tmp.* 2>/dev/null' || true)
    [ -z "$left" ] || { echo "  left on $s: $left" >&2; exit 1; }
  done
  nothing_left "after the BMv2 run with every switch on other servers"
  say "BMv2: doctor and up against a server without simple_switch_grpc"
  docker exec qb-c rm /usr/local/bin/simple_switch_grpc
  out=$("${A[@]}" .venv/bin/qaina-bench doctor --cluster localhost,qb-c --target bmv2 || true)
  echo "$out" | grep "^NO  qb-c: BMv2: simple_switch_grpc not on PATH" || exit 1
  out=$("${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-c --target bmv2 \
    --results-dir /results 2>&1 && exit 1 || true)
  echo "  up: $out"
  [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "qb-c: simple_switch_grpc not" \
    || exit 1
  docker exec qb-c ln -s /opt/bmv2/simple_switch_grpc /usr/local/bin/
else
  say "BMv2 scenario $bmv2"
fi

# While the BMv2 run is held: each remote BMv2's Thrift port refuses qb-a, and the
# harness's Thrift CLI (over ssh, to that server's loopback) reads its registers.
cat >"$work/thrift_check.py" <<'CHECK'
import json, re, socket, sys
from qaina_bench.harness.running.cluster import Server
from qaina_bench.harness.running.remotebmv2 import RemoteBMv2Target
rec = json.load(open(f"/run/qaina-bench/{sys.argv[1]}.json"))
remote = 0
for entry in rec["ports"]:
    m = re.fullmatch(r"Thrift of (\S+) on (\S+)", entry["what"])
    if not m:
        continue
    name, server = m.groups()
    try:
        socket.create_connection((server, entry["port"]), timeout=5).close()
        sys.exit(f"{name}'s Thrift port {entry['port']} on {server} is open to qb-a")
    except ConnectionRefusedError:
        pass
    target = RemoteBMv2Target(name, {}, 0, 0, "/dev/null", thrift_port=entry["port"],
                              server=Server(server))
    cells = target.register_read("MyIngress.agg_count")
    assert len(cells) > 0, cells
    remote += 1
assert remote == 3, rec["ports"]  # lf2 on qb-b, sp1 and sp2 on qb-c
print(f"  {remote} remote BMv2 Thrift ports: closed to qb-a, registers read over ssh")
CHECK
docker cp "$work/thrift_check.py" qb-a:/tmp/thrift_check.py
# While a run is held: each remote switch's P4Runtime port takes the harness's (qb-a's)
# reads and refuses a connection from the other container; its guard table is listed
# under its server in the run record.
cat >"$work/p4rt_check.py" <<'CHECK'
import json, re, shlex, subprocess, sys
from qaina_bench.harness.switches.control import SwitchConnection
rec = json.load(open(f"/run/qaina-bench/{sys.argv[1]}.json"))
probe = ("import socket, sys\ntry:\n    socket.create_connection(({!r}, {}), timeout=5)"
         "\nexcept OSError as e:\n    sys.exit(f'refused: {{e}}')\nprint('connected')")
checked = []
for entry in rec["ports"]:
    m = re.fullmatch(r"P4Runtime of (\S+) on (\S+)", entry["what"])
    if not m:
        continue
    name, server = m.groups()
    sw = rec["switches"][name]
    conn = SwitchConnection(name, sw["grpc_addr"], sw["device_id"])
    try:
        assert conn.wait_ready(10), f"{name}: qb-a cannot reach P4Runtime at {sw['grpc_addr']}"
        counters = conn.read_counters()
    finally:
        conn.close()
    other = "qb-c" if server == "qb-b" else "qb-b"
    host, port = sw["grpc_addr"].rsplit(":", 1)
    code = shlex.join([sys.executable, "-c", probe.format(host, port)])
    res = subprocess.run(["ssh", other, code], capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and "refused" in res.stderr, \
        f"{name}'s P4Runtime port {port} on {server} is open to {other}: {res.stdout}{res.stderr}"
    tables = [t["name"] for t in rec["servers"][server].get("nft_tables", [])]
    assert f"qaina_p4rt_{rec['owner']}_{port}" in tables, (name, tables)
    checked.append(f"{name} on {server}")
assert len(checked) == 3, checked  # lf2 on qb-b, sp1 and sp2 on qb-c
print(f"  P4Runtime of {', '.join(checked)}: read from qb-a ({len(counters)} counters), "
      "refused from the other container")
# the agents' starters run where hosts are: qb-b (h2), not qb-c (the spines alone)
starters = sorted(server for server, part in rec["servers"].items()
                  for p in part["processes"] if p["what"] == "starter of the agents")
assert starters == ["qb-b"], starters
print("  agents' starter on qb-b, none on qb-c (spines only)")
CHECK
docker cp "$work/p4rt_check.py" qb-a:/tmp/p4rt_check.py
export held_target

say "kill -9 of a held run ($held_target switches), then qaina-bench clean on qb-a"
flock /tmp/qb-mininet.lock sh -c '
  docker exec -d -w /opt/qaina-bench qb-a .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c \
    --topo leafspine --jobs 1 --workers 2 --iterations 1 --results-dir /results --run-id held --hold \
    --target '"$held_target"'
  for _ in $(seq 600); do
    docker exec qb-a grep -qs "held" /results/held/logs/agent-j1w1.log 2>/dev/null && break
    docker exec qb-a sh -c "grep -qs \"switch sp1\" /run/qaina-bench/held.json" && \
      docker exec qb-a sh -c "grep -qs \"agent j1w1\" /run/qaina-bench/held.json" && break
    sleep 0.2
  done
  sleep 3
  if [ "$held_target" = bmv2 ]; then
    docker exec -w /opt/qaina-bench qb-a .venv/bin/python /tmp/thrift_check.py held || exit 1
  fi
  docker exec -w /opt/qaina-bench qb-a .venv/bin/python /tmp/p4rt_check.py held || exit 1
  owner=$(docker exec qb-a .venv/bin/python -c "import json; print(json.load(open(\"/run/qaina-bench/held.json\"))[\"owner\"])")
  docker exec qb-a kill -9 "$owner"
  sleep 1
  docker exec -w /opt/qaina-bench qb-a .venv/bin/qaina-bench clean'
nothing_left "after kill -9 and clean"
for f in logs/sp1.log logs/lf2.log agents/j1w1.jsonl; do
  docker exec qb-a test -s "/results/held/$f" || { echo "  clean did not bring back $f" >&2; exit 1; }
done
docker exec qb-a test -f /results/held/logs/agent-j1w1.log || { echo "  no agent-j1w1.log" >&2; exit 1; }
echo "  clean brought qb-b's and qb-c's part of the killed run back to qb-a"

say "Ctrl-C (SIGINT) to a held run on qb-a"
flock /tmp/qb-mininet.lock sh -c '
  docker exec -d -w /opt/qaina-bench qb-a .venv/bin/qaina-bench up --cluster localhost,qb-b,qb-c \
    --topo leafspine --jobs 1 --workers 2 --iterations 1 --results-dir /results --run-id ctrlc --hold
  for _ in $(seq 600); do
    docker exec qb-a grep -qs "network stays up" /results/ctrlc/logs/mininet.log 2>/dev/null && break
    docker exec qb-a sh -c "grep -qs \"agent j1w1\" /run/qaina-bench/ctrlc.json" && break
    sleep 0.2
  done
  sleep 3
  docker exec -w /opt/qaina-bench qb-a .venv/bin/python /tmp/p4rt_check.py ctrlc || exit 1
  owner=$(docker exec qb-a .venv/bin/python -c "import json; print(json.load(open(\"/run/qaina-bench/ctrlc.json\"))[\"owner\"])")
  docker exec qb-a kill -INT "$owner"
  for _ in $(seq 300); do docker exec qb-a kill -0 "$owner" 2>/dev/null || break; sleep 0.2; done
  docker exec qb-a test -f /results/ctrlc/summary.json'
nothing_left "after Ctrl-C"
docker exec qb-a test -s /results/ctrlc/logs/sp1.log || { echo "  ctrlc: sp1.log not gathered" >&2; exit 1; }

say "a server frozen (docker pause qb-c: the spines) under a held run, then Ctrl-C"
# Every ssh of the run gives up on a server that does not answer (cluster.py BOUNDED), and
# the nodes' shells there are skipped once one is given up on (shells.py): the teardown
# ends, says what it left on qb-c, and clean removes it once qb-c answers again.
flock /tmp/qb-mininet.lock sh -c '
  docker exec -d -w /opt/qaina-bench qb-a sh -c ".venv/bin/qaina-bench up --cluster \
    localhost,qb-b,qb-c --topo leafspine --jobs 1 --workers 2 --iterations 1 \
    --results-dir /results --run-id frozen --hold >/tmp/frozen.out 2>&1"
  for _ in $(seq 600); do
    docker exec qb-a grep -qs "network stays up" /results/frozen/logs/mininet.log && break
    sleep 0.2
  done
  sleep 3
  owner=$(docker exec qb-a .venv/bin/python -c "import json; print(json.load(open(\"/run/qaina-bench/frozen.json\"))[\"owner\"])")
  docker pause qb-c >/dev/null
  start=$(date +%s)
  docker exec qb-a kill -INT "$owner"
  for _ in $(seq 900); do docker exec qb-a kill -0 "$owner" 2>/dev/null || break; sleep 0.2; done
  took=$(( $(date +%s) - start ))
  docker unpause qb-c >/dev/null
  docker exec qb-a tail -n 4 /tmp/frozen.out | cut -c1-200 | sed "s/^/  | /"
  if docker exec qb-a kill -0 "$owner" 2>/dev/null; then
    echo "  the run still tears down after $took s with qb-c frozen" >&2; exit 1
  fi
  echo "  teardown with qb-c frozen: $took s"
  docker exec qb-a grep -q "qb-c" /tmp/frozen.out || { echo "  the run did not name qb-c" >&2; exit 1; }
  docker exec qb-a test -f /results/frozen/summary.json || { echo "  no summary.json" >&2; exit 1; }
  docker exec -w /opt/qaina-bench qb-a .venv/bin/qaina-bench clean | grep "qb-c" | head -3'
nothing_left "after a frozen server and clean"

# e.g. QB_CLUSTER_SCALE="4 8 16 32" QB_CLUSTER_SCALE_REPEAT=3 QB_CLUSTER_SCALE_CSV=scale.csv
if [ -n "${QB_CLUSTER_SCALE:-}" ]; then
  say "bench scale over the three servers: workers $QB_CLUSTER_SCALE"
  flock /tmp/qb-mininet.lock "${A[@]}" .venv/bin/qaina-bench bench scale \
    $(printf -- '--workers %s ' $QB_CLUSTER_SCALE) --cluster localhost,qb-b,qb-c \
    --repeat "${QB_CLUSTER_SCALE_REPEAT:-1}" --results-dir /results/scale \
    --csv /results/scale.csv
  if [ -n "${QB_CLUSTER_SCALE_CSV:-}" ]; then
    docker cp qb-a:/results/scale.csv "$QB_CLUSTER_SCALE_CSV"
  fi
fi
say "doctor and up against a server without the project and a stopped one"
docker exec qb-c mv /opt/qaina-bench/.venv /opt/qaina-bench/.venv-off
docker stop -t 1 qb-b >/dev/null
out=$("${A[@]}" .venv/bin/qaina-bench doctor --cluster localhost,qb-b,qb-c || true)
echo "$out" | grep -E "^NO .*qb-[bc]"
echo "$out" | grep -q "^NO  qb-b: ssh: not reachable by ssh as root" || exit 1
echo "$out" | grep -q "^NO  qb-c: qaina-bench .*no qaina-bench at" || exit 1
out=$("${A[@]}" .venv/bin/qaina-bench up --cluster localhost,qb-c --results-dir /results 2>&1 \
  && exit 1 || true)
echo "  up: $out"
[ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "no qaina-bench at" || exit 1
say "passed"
