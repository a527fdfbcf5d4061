"""The Litestar application factory."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from litestar.datastructures import State
from litestar.openapi.config import OpenAPIConfig

from api.console import console_router
from api.forwarded import ForwardedClient, trusted_proxies
from api.ingest import post_events
from api.logs import configure_logging
from api.metrics import latency_middleware
from api.openapi_docs import COMPONENTS, StrictStructSchemaPlugin
from api.ops import healthz, metrics, readyz
from api.otlp import post_traces
from api.paths import FairmeterApp, decode_path_params
from api.policies import POLICY_HANDLERS
from api.problems import EXCEPTION_HANDLERS
from api.protection import get_protection_report
from api.ratelimit import rate_limit_middleware
from api.runs import get_run, settle_run_now
from api.schema_docs import OfflineRedocPlugin, schema_assets_router
from api.services import Services
from api.statements import create_statement_link, get_statement, open_statement_link
from api.streams import STREAM_HANDLERS
from api.stripe_webhooks import stripe_thin_webhook, stripe_webhook
from api.support import SUPPORT_HANDLERS
from api.webhooks import WEBHOOK_HANDLERS
from metering.config import Settings, load_settings, require_strong_pepper
from metering.heap import freeze_startup_heap


def create_served_app(settings: Settings | None = None) -> ForwardedClient:
    """The app as ``fairmeter serve`` runs it (uvicorn's factory): one per process, so once
    it has started, what it built is frozen out of the garbage collector's scans. A weak key
    pepper is refused here too, for uvicorn started by hand (``fairmeter serve`` checks it
    first, with a one-line message). ``X-Forwarded-For`` is believed from
    ``trusted_proxies`` only (api/forwarded.py)."""
    settings = settings or load_settings()
    require_strong_pepper(settings)

    async def freeze_heap() -> None:
        freeze_startup_heap()

    app = create_app(settings, on_startup=[freeze_heap])
    return ForwardedClient(app, trusted_proxies(settings.trusted_proxies))


def create_app(
    settings: Settings | None = None, *, on_startup: Sequence[Callable[[], object]] = ()
) -> FairmeterApp:
    settings = settings or load_settings()
    configure_logging(settings)
    services = Services.build(settings)

    async def shutdown() -> None:
        await services.close()

    return FairmeterApp(
        route_handlers=[
            post_events,
            post_traces,
            get_run,
            settle_run_now,
            get_statement,
            get_protection_report,
            create_statement_link,
            open_statement_link,
            *STREAM_HANDLERS,
            stripe_webhook,
            stripe_thin_webhook,
            healthz,
            readyz,
            metrics,
            *SUPPORT_HANDLERS,
            *WEBHOOK_HANDLERS,
            *POLICY_HANDLERS,
            console_router,
            schema_assets_router(),
        ],
        state=State({"services": services}),
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[
            decode_path_params,
            latency_middleware,
            rate_limit_middleware(services.limiter),
        ],
        request_max_body_size=settings.max_body_bytes,
        on_startup=list(on_startup),
        on_shutdown=[shutdown],
        openapi_config=OpenAPIConfig(
            title="Fairmeter",
            version="0.1.0",
            path="/schema",
            description="Usage metering and billing protection for AI-agent runs.",
            components=COMPONENTS,
            render_plugins=[OfflineRedocPlugin()],
        ),
        plugins=[StrictStructSchemaPlugin()],
        debug=False,
    )
