# ParaPlan service image: `paraplan serve` (API + embedded worker) on port 8000.
# The same image runs extra workers with `paraplan worker` (compose.yaml). Build: docker build -t paraplan .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DATABASE_URL=sqlite:////data/paraplan.db

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin paraplan \
    && mkdir -p /data && chown paraplan:paraplan /data

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY costmodel ./costmodel
COPY search ./search
COPY hardware_profiles ./hardware_profiles
COPY model_presets ./model_presets
COPY migrations ./migrations
RUN pip install -e ".[postgres]"

USER paraplan
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["paraplan"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
