# The LRA harness on CUDA 13.0 with torch 2.13.0, the torch the README pins and the docs measure,
# and the YOSO kernels (CPU and CUDA) compiled into a kernel cache at build time.
#   docker build --build-arg GIT_COMMIT="$(git rev-parse HEAD)" -t lra-harness .
#   docker run --gpus all -u "$(id -u):$(id -g)" -v "$PWD/data:/data" -v "$PWD/runs:/workspace/runs" \
#       lra-harness task=listops attention=yoso                   # arguments alone: lra-train
#   docker run ... lra-harness lra-prepare text --source aclimdb --path /data/aclImdb
#   docker run ... lra-harness lra-table runs/multirun            # any lra-* command (or python, bash)
# The base image's CUDA and the torch wheel's must agree: change CUDA_IMAGE and TORCH_INDEX_URL together.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
# The commit the image is built from (.git stays out of the build context); every run records it.
ARG GIT_COMMIT=unknown

# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
 && rm -rf /var/lib/apt/lists/*

# HOME=/tmp: a user given by `docker run -u` has no home directory, and tools write caches there.
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    LRA_DATA_DIR=/data \
    LRA_KERNEL_CACHE=/opt/lra-kernels \
    TORCH_CUDA_ARCH_LIST="7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX" \
    LRA_KERNEL_CPU_ARCH=x86-64-v3 \
    WANDB_MODE=offline

RUN python3 -m venv /opt/venv \
 && pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /opt/lra-src
COPY pyproject.toml README.md ./
COPY lra ./lra
COPY attention_zoo ./attention_zoo
COPY hydra_plugins ./hydra_plugins
COPY csrc ./csrc
COPY conf ./conf
COPY conf_profile ./conf_profile
COPY conf_fidelity ./conf_fidelity
# A finished kernel build is loaded without a lock or a write, so any user can use this root-built cache.
RUN pip install --no-cache-dir . \
 && lra-build-kernels cpu cuda \
 && chmod -R a+rX /opt/lra-kernels \
 && mkdir -p /workspace /data \
 && chmod 1777 /workspace /data

ENV LRA_GIT_COMMIT=${GIT_COMMIT}
WORKDIR /workspace
VOLUME ["/data", "/workspace/runs"]
ENTRYPOINT ["python", "-m", "lra.commands.entrypoint"]
