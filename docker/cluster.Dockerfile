# The project's image (Dockerfile, built first as qaina-bench:cluster-base) as a server
# of a cluster: sshd that lets root in by key and allows layer-2 tunnels (ssh -w, the
# links between servers), sudo-free. Host keys and the login key are made per test run
# (docker/cluster.sh), never kept in the image.
#
# BMV2=1 (docker/cluster.sh sets it when this machine has BMv2): also the Debian
# runtime libraries of a BMv2 and p4c built on Debian 12, python3-thrift for
# simple_switch_CLI and gcc (p4c preprocesses with cc). BMv2 and p4c themselves are
# not installed: the test bind-mounts this machine's build read-only at run time.
FROM qaina-bench:cluster-base
ARG BMV2=0
RUN apt-get -o DPkg::Lock::Timeout=600 update \
 && apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends openssh-server \
      openssh-client \
 && if [ "$BMV2" = 1 ]; then \
      apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
        libgrpc++1.51 libprotobuf32 libthrift-0.17.0 libboost-program-options1.74.0 \
        libnanomsg5 libpcap0.8 libgmp10 libjsoncpp25 libxxhash0 python3-thrift python3-six \
        gcc libboost-iostreams1.74.0 libgc1; \
    fi \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \
 && printf '%s\n' 'PermitRootLogin prohibit-password' 'PermitTunnel yes' 'UseDNS no' \
      'PasswordAuthentication no' > /etc/ssh/sshd_config.d/cluster.conf \
 && mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh
CMD ["sh", "-c", "ssh-keygen -A >/dev/null && exec /usr/sbin/sshd -D -e"]
