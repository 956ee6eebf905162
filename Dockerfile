# The Nexus image: web (daphne), Celery worker and beat all run from it (see docker-compose.yml).
FROM python:3.11-slim

# Templates and static files live beside the code, not in site-packages: import from /app.
ENV PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=nexus.settings \
    NEXUS_DATA_DIR=/data

WORKDIR /app
COPY . .
# The locked versions (requirements/constraints.txt, written by `make lock`), as every checkout gets.
RUN pip install --constraint requirements/constraints.txt . \
    && useradd --system --create-home --home-dir /home/nexus nexus \
    && mkdir -p /data \
    && chown nexus /data

USER nexus
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "nexus.asgi:application"]
