# The project's image (Dockerfile, built first as qaina-bench:cluster-base) as a server
# of a cluster: sshd that lets root in by key and allows layer-2 tunnels (ssh -w, the
# links between servers), sudo-free. Host keys and the login key are made per test run
# (docker/cluster.sh), never kept in the image.
FROM qaina-bench:cluster-base
RUN apt-get -o DPkg::Lock::Timeout=600 update \
 && apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends openssh-server \
      openssh-client \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \
 && printf '%s\n' 'PermitRootLogin prohibit-password' 'PermitTunnel yes' 'UseDNS no' \
      'PasswordAuthentication no' > /etc/ssh/sshd_config.d/cluster.conf \
 && mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh
CMD ["sh", "-c", "ssh-keygen -A >/dev/null && exec /usr/sbin/sshd -D -e"]
