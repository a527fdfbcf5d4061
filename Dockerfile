# One image for api, worker, beat and migrate; the command chooses the role.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 UV_LINK_MODE=copy
WORKDIR /app
RUN pip install --no-cache-dir uv
COPY pyproject.toml uv.lock README.md ./
COPY metering ./metering
COPY reconciler ./reconciler
COPY api ./api
COPY migrations ./migrations
RUN uv sync --frozen --no-dev
ENV PATH="/app/.venv/bin:$PATH"
USER nobody
EXPOSE 8000
CMD ["fairmeter", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
