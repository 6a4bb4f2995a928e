# The gateway image (CPU). For a CUDA image, take torch from the CUDA index instead (README, "CUDA").
FROM python:3.11-slim
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY heterofold heterofold
COPY engines engines
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
