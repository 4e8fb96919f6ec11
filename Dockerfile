# qaina-bench in a container: the project, its Python environment and Mininet, with
# the embedded switch (the default target). BMv2 and p4c: docker/bmv2.Dockerfile.
#
#   docker build -t qaina-bench .
#   docker run --rm --cap-add=NET_ADMIN --cap-add=SYS_ADMIN \
#       --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#       qaina-bench make up TOPO=star
#
# Mininet needs NET_ADMIN and SYS_ADMIN (namespaces, veth, raw sockets); nothing else
# of the host is needed (no kernel modules directory, no host network).
FROM debian:bookworm

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get -o DPkg::Lock::Timeout=600 update \
 && apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
      make python3 python3-venv ca-certificates \
      mininet iproute2 iputils-ping ethtool nftables procps cgroup-tools tcpdump tshark \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/qaina-bench
COPY . .
# No PyTorch in the image (TORCH=): its smoke subset needs none.
RUN make venv shell-tool TORCH= && rm -rf /root/.cache/pip

CMD ["make", "test"]
