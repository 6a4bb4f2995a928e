# The SGLang engine image (docker-compose.yml, target sglang): SGLang's release, the version the
# HiCache backend matches, with our store package on the path so that
# --hicache-storage-backend dynamic can load store.hicache.backend.HeteroFoldHiCache.
FROM lmsysorg/sglang:v0.5.23 AS sglang
WORKDIR /opt/heterofold
COPY heterofold heterofold
COPY store store
RUN pip install --no-cache-dir --no-deps "redis>=5,<9"
ENV PYTHONPATH=/opt/heterofold

# The gateway image (CPU). For a CUDA image, take torch from the CUDA index instead (README, "CUDA").
FROM python:3.11-slim AS gateway
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY heterofold heterofold
COPY engines engines
COPY harness harness
COPY store store
COPY gateway gateway
COPY dashboard dashboard
COPY bench bench
COPY migrations migrations
COPY config config
RUN pip install --no-cache-dir .
ENV HETEROFOLD_CACHE_DIR=/cache
VOLUME /cache
ENTRYPOINT ["heterofold"]
CMD ["run"]
