#!/usr/bin/env bash
# The Docker smoke test: build the project's image (Dockerfile) and run the test
# suite's smoke subset (pytest -m smoke) in a container; then run the Vagrant VM's
# provisioning script (from the Vagrantfile, without the parts that need p4lang's
# repository) in a fresh Debian 12 container and the smoke subset in what it made.
# The VM is Ubuntu 22.04, whose archive this machine cannot reach: Debian 12 has the
# same package names, and is what can be checked here.
#
# It needs no image registry and leaves the machine as it found it:
# * it runs a Docker daemon of its own (its own socket, data and exec roots under a
#   temporary directory, no bridge and no iptables rules), and stops it at the end;
# * it makes the debian:bookworm base image with debootstrap from the Debian mirror
#   this machine's apt uses, with this machine's extra CA certificates (HTTPS through
#   a TLS-inspecting proxy needs them); the Dockerfile itself stays portable;
# * the image is built with the host's network (apt, PyPI) and the tests run with
#   none (Mininet makes its own namespaces inside the container).
# Run as root: make docker-test
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=qaina-bench:smoke
NAME=docker-test WORK_PREFIX=qaina-docker
. docker/daemon.sh
trap daemon_stop EXIT

need_root_and
# A test that fails before its first container still leaves nothing (a daemon of its
# own, stopped at once: no mount under its roots).
left=$(NAME=docker-test-early WORK_PREFIX=qaina-docker-early bash -c \
  'set -euo pipefail; . docker/daemon.sh; trap daemon_stop EXIT; echo "$work"; daemon_start >/dev/null; exit 1' \
  || true)
[ -n "$left" ] && [ ! -e "$left" ] \
  || { echo "$NAME: a daemon stopped before its first container left ${left:-?}" >&2; exit 1; }
daemon_start
base_image

say "building $IMAGE"
docker build --network host -t "$IMAGE" . >"$work/build.log" 2>&1 \
  || { tail -n 30 "$work/build.log" >&2; exit 1; }

say "running the smoke tests in a container"
RUN=(docker run --rm --network none --cap-add=NET_ADMIN --cap-add=SYS_ADMIN
     --security-opt seccomp=unconfined --security-opt apparmor=unconfined)
"${RUN[@]}" "$IMAGE" .venv/bin/pytest -m smoke -q -p no:cacheprovider

say "running the Vagrant provisioning script in a Debian 12 container (no p4lang parts)"
sed -n "/<<-'SHELL'/,/^  SHELL\$/p" Vagrantfile | sed '1d;$d' >"$work/provision.sh"
grep -q "pip\" install" "$work/provision.sh" || { echo "no provisioning script found" >&2; exit 1; }
cid=$(docker create --network host -e QAINA_SKIP_P4LANG=1 debian:bookworm \
  bash /provision.sh)
git ls-files -co --exclude-standard -z \
  | tar --null -T - --transform 's,^,vagrant/,' -c | docker cp - "$cid:/"
docker cp "$work/provision.sh" "$cid:/provision.sh"
docker start -a "$cid" >"$work/provision.log" 2>&1 \
  || { tail -n 30 "$work/provision.log" >&2; docker rm "$cid" >/dev/null; exit 1; }
grep -E "^(ok|NO|--) " "$work/provision.log" || true
docker commit "$cid" qaina-bench:vagrant >/dev/null
docker rm "$cid" >/dev/null
"${RUN[@]}" -w /vagrant qaina-bench:vagrant /opt/qaina-bench/venv/bin/pytest -m smoke -q \
  -p no:cacheprovider
say "passed"
