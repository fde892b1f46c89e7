# LRA harness on a CUDA PyTorch devel image, with the YOSO kernels compiled at build time.
#   docker build -t lra-harness .
#   docker run --gpus all -v "$PWD/data:/data" -v "$PWD/runs:/workspace/runs" lra-harness task=listops attention=yoso
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel

ENV LRA_DATA_DIR=/data \
    LRA_KERNEL_CACHE=/opt/lra-kernels \
    TORCH_CUDA_ARCH_LIST="7.0 7.5 8.0 8.6 8.9 9.0+PTX" \
    LRA_KERNEL_CPU_ARCH=x86-64-v3 \
    WANDB_MODE=offline

WORKDIR /workspace
COPY pyproject.toml README.md ./
COPY lra ./lra
COPY attention_zoo ./attention_zoo
COPY csrc ./csrc
COPY conf ./conf
COPY conf_profile ./conf_profile
COPY conf_fidelity ./conf_fidelity
RUN pip install --no-cache-dir -e . \
 && python -m attention_zoo._yoso_build cpu cuda

VOLUME ["/data", "/workspace/runs"]
ENTRYPOINT ["lra-train"]
