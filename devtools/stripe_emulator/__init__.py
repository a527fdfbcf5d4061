"""The project's own Stripe emulator: an in-memory HTTP server for the Stripe subset Fairmeter uses.

Start one in-process with ``EmulatorServer().start()`` (tests) or as ``fairmeter stripe-emulator``
(``make up`` without ``STRIPE_API_KEY``). Point the official SDK at it with
``StripeClient(key, base_addresses={"api": url, ...})``. ``/_emulator/...`` is the control API
(clock, faults, settings, webhooks, state); it is not part of Stripe.
"""

from devtools.stripe_emulator.server import EmulatorServer
from devtools.stripe_emulator.state import EmulatorState

__all__ = ["EmulatorServer", "EmulatorState"]
