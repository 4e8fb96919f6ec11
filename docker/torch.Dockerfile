# The cluster image (docker/cluster.Dockerfile) plus PyTorch's CPU build in the
# project's environment, for docker/cluster.sh's --train-script run. The build context
# holds the one torch wheel this machine's pip takes for the Makefile's TORCH; its
# dependencies come from the package index.
ARG BASE=qaina-bench:cluster
FROM ${BASE}
COPY torch-*.whl /tmp/
RUN /opt/qaina-bench/.venv/bin/pip install -q /tmp/torch-*.whl \
 && rm -rf /tmp/torch-*.whl /root/.cache/pip
