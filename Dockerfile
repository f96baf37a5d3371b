# structgen on a CUDA host: `docker build -t structgen .`
#   docker run --gpus all -p 8000:8000 -v /path/to/model:/models/m -e STRUCTGEN_MODEL=/models/m structgen
# Without STRUCTGEN_MODEL (or --model) it serves the built-in offline model.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 structgen

WORKDIR /opt/structgen
COPY pyproject.toml README.md ./
COPY service service
COPY constrain constrain
COPY engine engine
COPY schemas schemas
# The README's install command, unchanged (CI runs the same line).
RUN python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 ".[test]"
# The cache volume's mount point, made here and owned by the user: Docker gives a new volume the image's owner
# of its mount point (root, had it not been made), and the server could not write its caches.
RUN mkdir -p /home/structgen/.cache/structgen /home/structgen/.cache/huggingface \
    && chown -R structgen:structgen /home/structgen/.cache

USER structgen
ENV STRUCTGEN_HOST=0.0.0.0 \
    STRUCTGEN_PORT=8000 \
    STRUCTGEN_SCHEMAS_DIR=/opt/structgen/schemas \
    STRUCTGEN_CACHE_DIR=/home/structgen/.cache/structgen \
    HF_HOME=/home/structgen/.cache/huggingface
VOLUME ["/models", "/home/structgen/.cache"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/opt/structgen/.venv/bin/python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('STRUCTGEN_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["/opt/structgen/.venv/bin/structgen", "serve"]
