# One image for api, worker, beat and migrate; the command chooses the role.
# Production code only: metering/, reconciler/, api/, cli/ and the migrations. The dev tools
# (devtools/) and the agent SDK (clients/python/) are not copied, and
# `--no-default-groups` keeps their dependencies out (tests/deploy checks the set).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 UV_LINK_MODE=copy
WORKDIR /app
RUN pip install --no-cache-dir uv
COPY pyproject.toml uv.lock README.md ./
# The workspace lists the SDK as a member: uv needs its metadata to read the lock file.
COPY clients/python/pyproject.toml clients/python/README.md ./clients/python/
COPY metering ./metering
COPY reconciler ./reconciler
COPY api ./api
COPY cli ./cli
COPY migrations ./migrations
# Compiled at build time: PYTHONDONTWRITEBYTECODE (and a read-only /app for `nobody`) means
# nothing is cached on import, and every API worker, Celery child and heavy-work process
# would compile SQLAlchemy, pydantic and Litestar from source at each start.
RUN uv sync --frozen --no-default-groups --compile-bytecode
ENV PATH="/app/.venv/bin:$PATH"
USER nobody
EXPOSE 8000
CMD ["fairmeter", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
