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
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)\/*$/\1/p' \
  /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d /tmp/qaina-docker.XXXXXX)
export DOCKER_HOST="unix://$work/docker.sock"
daemon=

say() { echo "docker-test: $*"; }

cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill "$daemon"
    for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$daemon" 2>/dev/null || true
  fi
  # Whatever the daemon mounted under its roots goes before the roots do.
  grep -o " $work/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done
  rm -rf "$work"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || { echo "docker-test: run as root (sudo make docker-test)" >&2; exit 2; }
missing=
command -v dockerd >/dev/null || missing="$missing docker.io"
command -v debootstrap >/dev/null || missing="$missing debootstrap"
if [ -n "$missing" ]; then
  say "installing$missing"
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends $missing
fi

say "starting a Docker daemon of its own ($work)"
dockerd --host "$DOCKER_HOST" --data-root "$work/data" --exec-root "$work/exec" \
  --pidfile "$work/dockerd.pid" --bridge=none --iptables=false --ip6tables=false \
  --storage-driver=overlay2 >"$work/dockerd.log" 2>&1 &
daemon=$!
for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
docker info >/dev/null 2>&1 || { tail -n 20 "$work/dockerd.log" >&2; exit 1; }

say "making the debian:bookworm base image from $MIRROR"
root="$work/rootfs"
debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$MIRROR" \
  >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
security=${MIRROR%/debian}/debian-security
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb $security bookworm-security main
SOURCES
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi
cp /etc/apt/apt.conf.d/99artifact-registry "$root/etc/apt/apt.conf.d/" 2>/dev/null || true
tar -C "$root" -c . | docker import - debian:bookworm >/dev/null
rm -rf "$root"

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
