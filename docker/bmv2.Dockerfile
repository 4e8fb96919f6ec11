# qaina-bench with BMv2 (simple_switch_grpc) and p4c, on p4lang's own image.
#
# p4lang/p4c is the image p4lang publishes with both tools: it is built FROM
# p4lang/behavioral-model (simple_switch_grpc, sswitch_grpc=yes), itself FROM
# p4lang/pi (P4Runtime), on Ubuntu 24.04 with Python 3.12. Pin a tag or digest you
# have tested instead of latest for reproducible results. This file is not built by
# the project's CI: no image registry is reachable from the machines it runs on.
#
#   docker build -f docker/bmv2.Dockerfile -t qaina-bench:bmv2 .
#   docker run --rm --cap-add=NET_ADMIN --cap-add=SYS_ADMIN \
#       --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#       qaina-bench:bmv2 .venv/bin/qaina-bench up --target bmv2 --topo star
ARG P4C_IMAGE=p4lang/p4c:latest
FROM ${P4C_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      make python3 python3-venv ca-certificates \
      mininet iproute2 iputils-ping ethtool nftables procps cgroup-tools \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/qaina-bench
COPY . .
RUN make venv && simple_switch_grpc --version && p4c --version

CMD ["make", "test"]
