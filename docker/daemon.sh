# A Docker daemon of a test's own, sourced by docker/smoke.sh and docker/cluster.sh.
# It needs no image registry and leaves the machine as it found it: its own socket,
# data and exec roots under a temporary directory, no bridge and no iptables rules;
# the debian:bookworm base image made with debootstrap from the Debian mirror this
# machine's apt uses, with this machine's extra CA certificates (HTTPS through a
# TLS-inspecting proxy needs them). Set NAME (the test's name in messages) and
# WORK_PREFIX before sourcing; `daemon_stop` in the caller's EXIT trap.

MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)\/*$/\1/p' \
  /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "/tmp/$WORK_PREFIX.XXXXXX")
export DOCKER_HOST="unix://$work/docker.sock"
daemon=

say() { echo "$NAME: $*"; }

# Root, and the packages whose commands are missing ("command:package" pairs).
need_root_and() {
  [ "$(id -u)" -eq 0 ] || { echo "$NAME: run as root (sudo make $NAME)" >&2; exit 2; }
  local missing= pair
  for pair in dockerd:docker.io debootstrap:debootstrap "$@"; do
    command -v "${pair%%:*}" >/dev/null || missing="$missing ${pair#*:}"
  done
  if [ -n "$missing" ]; then
    say "installing$missing"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends $missing
  fi
}

daemon_start() {
  say "starting a Docker daemon of its own ($work)"
  dockerd --host "$DOCKER_HOST" --data-root "$work/data" --exec-root "$work/exec" \
    --pidfile "$work/dockerd.pid" --bridge=none --iptables=false --ip6tables=false \
    --storage-driver=overlay2 >"$work/dockerd.log" 2>&1 &
  daemon=$!
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { tail -n 20 "$work/dockerd.log" >&2; exit 1; }
}

# The daemon stopped, whatever it mounted under its roots unmounted, the roots gone.
daemon_stop() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill "$daemon"
    for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$daemon" 2>/dev/null || true
  fi
  # (no mount at all when it stopped before its first container: grep finds none)
  { grep -o " $work/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" || true; done
  rm -rf "$work"
}

base_image() {
  say "making the debian:bookworm base image from $MIRROR"
  local root="$work/rootfs" security=${MIRROR%/debian}/debian-security
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$MIRROR" \
    >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
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
}
