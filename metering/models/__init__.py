"""SQLModel tables: columns and constraints only, no behaviour.

Importing this package registers every table on ``SQLModel.metadata``, which is what Alembic
compares against.
"""

from metering.models.base import metadata
from metering.models.billing import (
    StripeCarryRow,
    StripeClosedPeriodRow,
    StripeDeliveryKeyRow,
    StripeDeliveryRow,
    StripeInvoiceRow,
    StripeOutboxRow,
    StripeWebhookRow,
)
from metering.models.catalog import PriceRow, ProviderCostRow
from metering.models.events import EventKeyRow, EventRow, RunRow, UsageLineRow
from metering.models.history import ArchivedMonthRow
from metering.models.ledger import LedgerEntryRow
from metering.models.notifications import NotificationRow
from metering.models.policies import PolicyVersionRow, PolicyWithdrawalRow
from metering.models.settlement import DecisionRow
from metering.models.statements import (
    StatementClosingRow,
    StatementLineRow,
    StatementTotalRow,
)
from metering.models.support import AuditRow, DisputeRow, SupportCreditRow
from metering.models.tenancy import ApiKeyRow, ConsoleSessionRow, CustomerRow, TenantRow
from metering.models.webhooks import (
    WebhookAttemptRow,
    WebhookEndpointRow,
    WebhookFanoutRow,
    WebhookMessageRow,
)

__all__ = [
    "ApiKeyRow",
    "ArchivedMonthRow",
    "AuditRow",
    "ConsoleSessionRow",
    "CustomerRow",
    "DecisionRow",
    "DisputeRow",
    "EventKeyRow",
    "EventRow",
    "LedgerEntryRow",
    "NotificationRow",
    "PolicyVersionRow",
    "PolicyWithdrawalRow",
    "PriceRow",
    "ProviderCostRow",
    "RunRow",
    "StatementClosingRow",
    "StatementLineRow",
    "StatementTotalRow",
    "StripeCarryRow",
    "StripeClosedPeriodRow",
    "StripeDeliveryKeyRow",
    "StripeDeliveryRow",
    "StripeInvoiceRow",
    "StripeOutboxRow",
    "StripeWebhookRow",
    "SupportCreditRow",
    "TenantRow",
    "UsageLineRow",
    "WebhookAttemptRow",
    "WebhookEndpointRow",
    "WebhookFanoutRow",
    "WebhookMessageRow",
    "metadata",
]
